"""When and how long to wait before another attempt (upstream's retry executor, sans-I/O).

``retry_max_retries`` counts attempts in all (1 = no retry; ``disable_retries`` means 1). A worker answer is
worth another attempt when its status is one of ``RETRYABLE_STATUSES`` (observed on vllm-router 0.1.17: 408,
429, 500, 502, 503 and 504 are retried; 400 and 501 are not), and so is a connection error or a timeout
before the response started. The wait before attempt ``n + 1`` is ``initial · multiplier^(n-1)`` ms, capped
at the maximum, then moved by a uniform ±jitter fraction of itself.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from progrouter.config import RouterConfig

RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int
    initial_backoff_ms: int
    max_backoff_ms: int
    multiplier: float
    jitter: float

    @classmethod
    def from_config(cls, config: RouterConfig) -> RetryPolicy:
        return cls(
            attempts=config.retry_attempts,
            initial_backoff_ms=config.retry_initial_backoff_ms,
            max_backoff_ms=config.retry_max_backoff_ms,
            multiplier=config.retry_backoff_multiplier,
            jitter=config.retry_jitter_factor,
        )

    def backoff_seconds(self, retry: int, rng: random.Random) -> float:
        """The wait before retry number ``retry`` (1 = the second attempt)."""
        delay = min(self.initial_backoff_ms * self.multiplier ** (retry - 1), float(self.max_backoff_ms))
        if self.jitter > 0:
            delay += delay * rng.uniform(-self.jitter, self.jitter)
        return max(0.0, delay) / 1000.0


def is_retryable(status: int) -> bool:
    return status in RETRYABLE_STATUSES
