"""``Telemetry``: the observer with the two switches every reporting path reads before it builds anything.

Decided once: with the no-op observer, metrics and events are not built at all (``observing``). Debug events
are built only while the observer keeps them (``debugging``), asked again every tick (``attend``: a log level
may have changed). One instance is shared by every component that reports; only the scheduler calls
``attend``.
"""

from __future__ import annotations

from progrouter.program.observer import NullObserver, SchedulerObserver


class Telemetry:
    __slots__ = ("debugging", "observer", "observing")

    def __init__(self, observer: SchedulerObserver) -> None:
        self.observer = observer
        self.observing = type(observer) is not NullObserver
        self.debugging = False
        self.attend()

    def attend(self) -> None:
        """Ask the observer again whether it keeps debug events: at start and every tick."""
        self.debugging = self.observing and self.observer.wants_debug()
