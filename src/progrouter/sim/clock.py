"""The virtual clock: a heap of ``(time, seq, callback, arg)`` popped in order.

``seq`` breaks ties in scheduling order, so two events at the same instant always run in the order they were
scheduled and a run is a pure function of its inputs. Callbacks schedule further events; nothing here knows
what an event means.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any

Callback = Callable[[Any], None]


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callback, Any]] = []
        self._seq = itertools.count()
        self.events_run = 0

    def at(self, when: float, callback: Callback, arg: Any = None) -> None:
        """Run ``callback(arg)`` at ``when`` (never in the past: an earlier time runs now)."""
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), callback, arg))

    def soon(self, when: float, callback: Callback, arg: Any = None) -> None:
        """``at(when, callback, arg)``, except that a callback due now, with nothing else due now, runs at
        once: it would be the very next event anyway (a heap round trip fewer; ``events_run`` skips it)."""
        heap = self._heap
        if when <= self.now and (not heap or heap[0][0] > self.now):
            callback(arg)
        else:
            self.at(when, callback, arg)

    def run(self, stop: Callable[[], bool], until: float = math.inf) -> None:
        """Pop events in order until none are left, the next is after ``until``, or ``stop()`` is true after
        an event."""
        heap = self._heap
        while heap and heap[0][0] <= until:
            when, _, callback, arg = heapq.heappop(heap)
            self.now = when
            callback(arg)
            self.events_run += 1
            if stop():
                return

    def __len__(self) -> int:
        return len(self._heap)
