"""A circuit breaker per worker (sans-I/O: every call takes ``now``, so tests drive a fake clock).

Closed: requests flow; ``failure_threshold`` consecutive failures, each within ``window`` seconds of the
previous one, open it. Open: the worker is skipped by selection until ``timeout`` seconds have passed, then
it is half-open. Half-open: requests flow again; ``success_threshold`` consecutive successes close it, any
failure reopens it. A failure is a worker that could not be reached, timed out, or answered 5xx.

Upstream 0.1.17 counts consecutive failures with no window (observed: two failures 1.6 s apart open a
breaker with ``--cb-window-duration-secs 1``); here the window is honoured, which only differs when failures
are further apart than the window (120 s by default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from progrouter.config import RouterConfig


class BreakerState(IntEnum):
    """Values as upstream's ``cb_state`` gauge: 0 closed, 1 open, 2 half-open."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2

    @property
    def label(self) -> str:
        return self.name.lower()


Transition = Callable[[str, BreakerState, BreakerState], None]


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    """What every breaker of a router shares (``--cb-*``)."""

    failure_threshold: int
    success_threshold: int
    timeout: float  # seconds open before half-open
    window: float  # seconds within which consecutive failures add up

    @classmethod
    def from_config(cls, config: RouterConfig) -> BreakerSettings:
        return cls(
            config.cb_failure_threshold,
            config.cb_success_threshold,
            config.cb_timeout_duration_secs,
            config.cb_window_duration_secs,
        )


class CircuitBreaker:
    __slots__ = (
        "_failures",
        "_last_failure",
        "_on_transition",
        "_opened_at",
        "_successes",
        "settings",
        "state",
        "worker",
    )

    def __init__(
        self, worker: str, settings: BreakerSettings, on_transition: Transition | None = None
    ) -> None:
        self.worker = worker
        self.settings = settings
        self.state = BreakerState.CLOSED
        self._failures = 0
        self._successes = 0
        self._last_failure = 0.0
        self._opened_at = 0.0
        self._on_transition = on_transition

    def allows(self, now: float) -> bool:
        """Whether a request may go to the worker now (an open breaker turns half-open after its timeout)."""
        if self.state is BreakerState.OPEN and now - self._opened_at >= self.settings.timeout:
            self._move(BreakerState.HALF_OPEN, now)
        return self.state is not BreakerState.OPEN

    def seconds_until_half_open(self, now: float) -> float:
        """How long an open breaker still refuses (0 when it is not open, or its timeout has passed)."""
        if self.state is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self._opened_at + self.settings.timeout - now)

    def record(self, success: bool, now: float) -> None:
        """One finished attempt on the worker."""
        if success:
            self._failures = 0
            self._successes += 1
            if self.state is BreakerState.HALF_OPEN and self._successes >= self.settings.success_threshold:
                self._move(BreakerState.CLOSED, now)
            return
        self._successes = 0
        if self.state is BreakerState.HALF_OPEN:
            self._move(BreakerState.OPEN, now)
            return
        if self._failures and now - self._last_failure > self.settings.window:
            self._failures = 0  # the previous failures are too old to count together with this one
        self._failures += 1
        self._last_failure = now
        if self.state is BreakerState.CLOSED and self._failures >= self.settings.failure_threshold:
            self._move(BreakerState.OPEN, now)

    def _move(self, to: BreakerState, now: float) -> None:
        before, self.state = self.state, to
        self._failures = 0
        self._successes = 0
        if to is BreakerState.OPEN:
            self._opened_at = now
        if self._on_transition is not None:
            self._on_transition(self.worker, before, to)


class Breakers:
    """One breaker per target id, created on first use; reports states and transitions to ``metrics``."""

    def __init__(
        self, settings: BreakerSettings, *, enabled: bool, on_transition: Transition | None = None
    ) -> None:
        self.enabled = enabled
        self._settings = settings
        self._on_transition = on_transition
        self._by_target: dict[str, CircuitBreaker] = {}

    def get(self, target_id: str) -> CircuitBreaker:
        breaker = self._by_target.get(target_id)
        if breaker is None:
            breaker = self._by_target[target_id] = CircuitBreaker(
                target_id, self._settings, self._on_transition
            )
        return breaker

    def allows(self, target_id: str, now: float) -> bool:
        return not self.enabled or target_id not in self._by_target or self._by_target[target_id].allows(now)

    def seconds_until_half_open(self, target_id: str, now: float) -> float:
        breaker = self._by_target.get(target_id)
        return 0.0 if not self.enabled or breaker is None else breaker.seconds_until_half_open(now)

    def record(self, target_id: str, success: bool, now: float) -> None:
        if self.enabled:
            self.get(target_id).record(success, now)

    def forget(self, target_id: str) -> None:
        """A target left the configuration: its history must not outlive it."""
        self._by_target.pop(target_id, None)
