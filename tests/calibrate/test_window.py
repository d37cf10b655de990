"""The decode step estimate uses only the steps in which the whole batch was decoding."""

from __future__ import annotations

import pytest

from progrouter.calibrate.measure import StreamResult, common_window_steps, disturbance


def stream(first: float, step: float, tokens: int, start_token: int = 1) -> list[tuple[float, int]]:
    return [(first + i * step, start_token + i) for i in range(tokens)]


def test_aligned_batch_gives_the_step() -> None:
    steps = common_window_steps([stream(1.0, 0.01, 20), stream(1.0, 0.01, 20)])
    assert steps == pytest.approx([0.01, 0.01])


def test_a_late_starter_inflating_early_steps_is_excluded() -> None:
    # Request A decodes from t=1.0; request B's prefill rides in A's 2nd step (0.1 s long), after which
    # both decode in 0.01 s steps. The whole-stream average for A would be ~0.0147 s.
    a = [(1.0, 1), (1.1, 2)] + [(1.1 + 0.01 * i, 2 + i) for i in range(1, 19)]
    b = [(1.1 + 0.01 * i, 1 + i) for i in range(0, 19)]
    steps = common_window_steps([a, b])
    assert steps == pytest.approx([0.01, 0.01])
    whole = (a[-1][0] - a[0][0]) / (a[-1][1] - a[0][1])
    assert whole > 0.014


def test_coalesced_chunks_count_tokens_not_chunks() -> None:
    # One chunk carries three tokens: Δtokens, not the chunk count, divides the time.
    pts = [(0.0, 1), (0.01, 2), (0.04, 5), (0.05, 6)]
    assert common_window_steps([pts]) == pytest.approx([0.01])


def test_one_late_token_moves_the_step_little() -> None:
    # The last token is read 20 ms late (a busy host): Δtime/Δtokens between the ends would say 0.01105 s.
    pts = stream(0.0, 0.01, 20)
    pts[-1] = (pts[-1][0] + 0.02, pts[-1][1])
    (step,) = common_window_steps([pts])
    assert step == pytest.approx(0.01, rel=0.03) and step > 0.01


def test_no_overlap_falls_back_to_each_whole_stream() -> None:
    steps = common_window_steps([stream(0.0, 0.01, 5), stream(1.0, 0.02, 5)])
    assert steps == pytest.approx([0.01, 0.02])


def test_a_tiny_window_falls_back_to_whole_streams() -> None:
    # B's first token only arrived with A's last few: the common window holds too few of A's tokens.
    a = stream(0.0, 0.01, 20)
    b = [(0.185, 1), (0.1851, 2), (0.1852, 3), (0.19, 20)]
    steps = common_window_steps([a, b])
    assert steps[0] == pytest.approx(0.01)


def _result(points: list[tuple[float, int]]) -> StreamResult:
    return StreamResult(points[0][0], points[-1][0], len(points), 100, points[-1][1], 0, tuple(points))


def test_disturbance_flags_coalesced_chunks_and_disagreeing_requests() -> None:
    clean = [_result(stream(0.0, 0.01, 20)), _result(stream(0.0, 0.01, 20))]
    assert disturbance(clean, [0.01, 0.01]) is None
    burst = [(0.0, 1), (0.01, 2), (0.19, 20)]  # 18 tokens in one chunk
    flagged = disturbance([_result(burst), clean[0]], [0.01, 0.01])
    assert flagged is not None and "several per chunk" in flagged
    assert disturbance(clean, [0.01, 0.03]) == "per-request step times disagree by more than 2x"
    # one token per chunk, but read in two bursts: the median gap is ~0 against a mean of ~10 ms
    bursts = (
        [(0.0, 1)]
        + [(0.1 + i * 1e-5, 2 + i) for i in range(9)]
        + [(0.19 + i * 1e-5, 11 + i) for i in range(9)]
    )
    flagged = disturbance([_result(bursts)], [0.01])
    assert flagged is not None and "bursts" in flagged
    assert disturbance(clean, [0.0, 0.01]) is not None
