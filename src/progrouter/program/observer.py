"""What the scheduler core reports as it decides: metrics and log events, without doing I/O itself.

The core calls an ``SchedulerObserver``; the live router plugs in one that feeds Prometheus and ``logging``
(``server/program_metrics.py``), the simulator one that counts, tests the ``RecordingObserver``. Names follow
``spec/upstream-behavior.md`` §6: metric names drop the ``vllm_router_agent_aware_`` prefix here.
Labels are only target ids and bounded enums; Program ids arrive already redacted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

LogLevel = Literal["debug", "info", "warning"]


class SchedulerObserver(Protocol):
    def transition(self, target: str, reason: str) -> None:
        """Count ``transitions_total{target, reason}``."""

    def histogram(self, name: str, value: float, **labels: str) -> None:
        """Observe a histogram, e.g. ``queue_wait_seconds`` with ``target=…``."""

    def gauge(self, name: str, value: float, **labels: str) -> None:
        """Set a gauge, e.g. ``rank_queue_size`` with ``target=…``."""

    def counter(self, name: str, amount: float = 1.0, **labels: str) -> None:
        """Increment a counter other than transitions, e.g. ``token_estimate_feedback_total``."""

    def event(self, level: LogLevel, name: str, **fields: Any) -> None:
        """A structured log event (``event=name``), e.g. ``program_admit`` at info."""

    def wants_debug(self) -> bool:
        """Whether it keeps debug events now. The core asks when it starts and at every tick, and builds no
        debug event in between while the answer is no (their fields — redacted ids, floats — cost more than
        the metrics beside them); metrics and the other levels are always reported."""


class NullObserver:
    """Observes nothing: the default for library use and benchmarks of the core."""

    def transition(self, target: str, reason: str) -> None:
        return None

    def histogram(self, name: str, value: float, **labels: str) -> None:
        return None

    def gauge(self, name: str, value: float, **labels: str) -> None:
        return None

    def counter(self, name: str, amount: float = 1.0, **labels: str) -> None:
        return None

    def event(self, level: LogLevel, name: str, **fields: Any) -> None:
        return None

    def wants_debug(self) -> bool:
        return False


@dataclass
class RecordingObserver:
    """Keeps everything it is told, for tests and the simulator."""

    transitions: list[tuple[str, str]] = field(default_factory=list)
    histograms: list[tuple[str, float, dict[str, str]]] = field(default_factory=list)
    gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    events: list[tuple[LogLevel, str, dict[str, Any]]] = field(default_factory=list)

    def transition(self, target: str, reason: str) -> None:
        self.transitions.append((target, reason))

    def histogram(self, name: str, value: float, **labels: str) -> None:
        self.histograms.append((name, value, labels))

    def gauge(self, name: str, value: float, **labels: str) -> None:
        self.gauges[(name, tuple(sorted(labels.items())))] = value

    def counter(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        self.counters[key] = self.counters.get(key, 0.0) + amount

    def event(self, level: LogLevel, name: str, **fields: Any) -> None:
        self.events.append((level, name, fields))

    def wants_debug(self) -> bool:
        return True

    def events_named(self, name: str) -> list[dict[str, Any]]:
        return [f for _, n, f in self.events if n == name]
