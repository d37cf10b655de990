"""The tokens-per-byte EMA: defaults, the update rule, clamping, scoping, feedback metrics."""

from __future__ import annotations

import pytest

from progrouter.agents.token_estimator import TokenEstimator, prompt_bytes
from progrouter.program.observer import RecordingObserver

pytestmark = pytest.mark.timeout(30)

CHAT = "/v1/chat/completions"


def test_feedback_moves_the_coefficient_not_the_next_count() -> None:
    estimator = TokenEstimator()
    first = estimator.estimate("m", CHAT, 400)
    assert first.tokens == 100
    assert estimator.observe(first, 200) == pytest.approx(0.275)
    assert estimator.estimate("m", CHAT, 800).tokens in (220, 221)


def test_ratio_is_clamped_and_ceil_applies() -> None:
    estimator = TokenEstimator()
    huge = estimator.estimate("m", CHAT, 1)
    assert estimator.observe(huge, 1000) == pytest.approx(0.9 * 0.25 + 0.1 * 4.0)
    tiny = estimator.estimate("m", "/v1/completions", 10_000)
    assert estimator.observe(tiny, 1) == pytest.approx(0.9 * 0.25 + 0.1 * 0.01)
    assert estimator.estimate("m", "/v1/completions", 3).tokens == 1  # ceil(3 × 0.226) = 1
    assert estimator.estimate("x", CHAT, 0).tokens == 1


def test_scopes_are_independent_and_diagnostics_sorted() -> None:
    estimator = TokenEstimator()
    estimator.observe(estimator.estimate("b", CHAT, 100), 50)
    estimator.observe(estimator.estimate("a", CHAT, 100), 10)
    assert estimator.coefficient("c", CHAT) == 0.25
    assert [d["model_pool"] for d in estimator.diagnostics()] == ["a", "b"]
    assert estimator.diagnostics()[0]["tokens_per_byte"] == pytest.approx(0.9 * 0.25 + 0.1 * 0.1)


def test_missing_usage_counts_feedback_without_moving() -> None:
    observer = RecordingObserver()
    estimator = TokenEstimator(observer)
    estimate = estimator.estimate("m", CHAT, 100)
    assert estimator.observe(estimate, None) is None
    assert estimator.observe(estimate, 40) == pytest.approx(0.265)
    labels = (("endpoint", CHAT), ("model_pool", "m"))
    for outcome in ("missing", "observed"):
        assert observer.counters[("token_estimate_feedback_total", (*labels, ("outcome", outcome)))] == 1
    assert observer.gauges[("token_estimate_coefficient", labels)] == pytest.approx(0.265)
    expected = [{"model_pool": "m", "endpoint": CHAT, "tokens_per_byte": pytest.approx(0.265)}]
    assert estimator.diagnostics() == expected


def test_prompt_bytes_measures_only_prompt_bearing_fields() -> None:
    messages = [{"role": "user", "content": "hello"}]
    base = {"model": "m", "messages": messages}
    noisy = {**base, "max_tokens": 5, "stream": True, "vllm_xargs": {"agentic_context": "x" * 500}}
    assert prompt_bytes(base, b"") == prompt_bytes(noisy, b"") == len(b'[{"role":"user","content":"hello"}]')
    assert prompt_bytes({"prompt": "héllo"}, b"") == 6
    assert prompt_bytes({"prompt": "hello"}, b"") == 5
    assert prompt_bytes({"system": "s", "messages": [], "tools": [{"a": 1}]}, b"") == 1 + 2 + 9
    assert prompt_bytes(None, b"raw bytes") == 9
