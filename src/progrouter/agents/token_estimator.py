"""Prompt-token estimates at arrival, without asking a worker (upstream ``token_estimator.rs``).

Admission needs a Program's context size before the backend has seen the request. Upstream calls ``/render``
and ``/tokenize`` on the workers for every Program request; we do not. Instead each (model pool, endpoint)
keeps a tokens-per-byte coefficient, starting at 0.25, applied to the bytes of the prompt-bearing part of the
body and corrected after each successful completion from the ``usage.prompt_tokens`` the backend reports:
``new = 0.9 · old + 0.1 · clamp(actual / bytes, 0.01, 4)``.

Measuring only the prompt-bearing fields of the body's shape (``routing.request_text.prompt_sections``: chat
and Messages system + tools + messages, Responses instructions + tools + input, completions prompt, generate
text) keeps sampling knobs, ``stream_options``, ``metadata`` and the identity envelope out of the estimate, so
the coefficient tracks the chat template's real expansion. Sans-I/O; metrics go through a
``SchedulerObserver``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import orjson

from progrouter.program import NullObserver, SchedulerObserver
from progrouter.routing.request_text import prompt_sections

DEFAULT_TOKENS_PER_BYTE = 0.25
MOMENTUM = 0.9
MIN_TOKENS_PER_BYTE = 0.01
MAX_TOKENS_PER_BYTE = 4.0


def prompt_bytes(body: Mapping[str, Any] | None, raw_body: bytes) -> int:
    """Bytes of the prompt-bearing fields of ``body`` (JSON-encoded); the whole raw body without one."""
    if body is None:
        return len(raw_body)
    total = 0
    for _kind, value in prompt_sections(body):
        if value is None:
            continue
        if isinstance(value, str):  # an ASCII string is its own byte count: no 400 kB encode to learn it
            total += len(value) if value.isascii() else len(value.encode())
        else:
            try:
                total += len(orjson.dumps(value))
            except TypeError:
                continue
    return total


class TokenEstimate(NamedTuple):
    """An arrival estimate and what is needed to learn from its outcome. (A tuple: one is made per
    Program request.)"""

    tokens: int
    model_pool: str
    endpoint: str
    input_bytes: int


class TokenEstimator:
    """Tokens-per-byte EMA per (model pool, endpoint)."""

    def __init__(self, observer: SchedulerObserver | None = None) -> None:
        self._observer: SchedulerObserver = observer or NullObserver()
        self._coefficients: dict[tuple[str, str], float] = {}

    def coefficient(self, model_pool: str, endpoint: str) -> float:
        return self._coefficients.get((model_pool, endpoint), DEFAULT_TOKENS_PER_BYTE)

    def estimate(self, model_pool: str, endpoint: str, input_bytes: int) -> TokenEstimate:
        """ceil(bytes × coefficient), at least one token."""
        tokens = max(1, math.ceil(input_bytes * self.coefficient(model_pool, endpoint)))
        return TokenEstimate(tokens, model_pool, endpoint, input_bytes)

    def observe(self, estimate: TokenEstimate, actual_prompt_tokens: int | None) -> float | None:
        """Feed back a successful completion's prompt size; returns the new coefficient if it moved.

        Counts ``token_estimate_feedback_total{outcome=observed|missing}`` either way, so a backend that never
        reports usage (e.g. streams without ``stream_options.include_usage``) is visible.
        """
        model_pool, endpoint = estimate.model_pool, estimate.endpoint
        outcome = "missing" if actual_prompt_tokens is None else "observed"
        self._observer.counter(
            "token_estimate_feedback_total", 1.0, model_pool=model_pool, endpoint=endpoint, outcome=outcome
        )
        if not actual_prompt_tokens or estimate.input_bytes <= 0:
            return None
        observed = min(
            MAX_TOKENS_PER_BYTE, max(MIN_TOKENS_PER_BYTE, actual_prompt_tokens / estimate.input_bytes)
        )
        key = (model_pool, endpoint)
        updated = (
            MOMENTUM * self._coefficients.get(key, DEFAULT_TOKENS_PER_BYTE) + (1.0 - MOMENTUM) * observed
        )
        self._coefficients[key] = updated
        self._observer.gauge("token_estimate_coefficient", updated, model_pool=model_pool, endpoint=endpoint)
        return updated

    def diagnostics(self) -> list[dict[str, Any]]:
        """``[{model_pool, endpoint, tokens_per_byte}]`` sorted, for ``/scheduling/diagnostics``."""
        return [
            {"model_pool": pool, "endpoint": endpoint, "tokens_per_byte": value}
            for (pool, endpoint), value in sorted(self._coefficients.items())
        ]
