"""The scheduler's clock-driven work, kept in one heap so ``next_deadline`` and each event are O(log n).

Entries are never removed when they become moot (a Program resumed before its force deadline, a request was
dispatched before its queue timeout): the scheduler checks each due entry against the current facts and
drops stale ones. ``next_deadline`` may therefore name a time at which nothing turns out to be due; that
costs one early tick, never a missed one. A Program has at most one pending entry per kind (``arm``): when
its due time moves later, the earlier entry fires, finds the new time and re-arms, so Programs that pause
and queue again and again never pile entries up. A Program's entries hold only its serial: the Program is
kept here while it has a pending entry, and its release lets go of it at once (``forget``), however long
its entries take to surface.

Heap entries hold atomic values only — the due time, the kind's number, a sequence number and a Program's
serial, a request handle's id or a target id — so the cyclic garbage collector stops tracking each entry
after its first collection instead of traversing the tens of thousands of them at every older-generation
pass.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from progrouter.program.state import Program


class TimerKind(IntEnum):
    """At equal times, lower kinds are handled first (a force resume before a queue timeout)."""

    ACTING_TTL = 0
    PAUSED_RETENTION = 1
    OBSERVATION_STALE = 2
    FORCE_RESUME = 3
    QUEUE_TIMEOUT = 4


Due = tuple[float, TimerKind, object]

#: kinds whose entries are a Program's (the heap holds its serial)
PROGRAM_KINDS = frozenset({TimerKind.ACTING_TTL, TimerKind.PAUSED_RETENTION, TimerKind.FORCE_RESUME})
_KINDS = tuple(TimerKind)  # by number: the heap keeps the plain int (an enum member would keep it tracked)


class Timers:
    __slots__ = ("_floor", "_heap", "_programs", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, int | str]] = []  # when, kind's number, sequence, payload
        self._seq = itertools.count()
        self._floor = 0  # entries left by the last compaction (all valid then)
        self._programs: dict[int, Program] = {}  # serial -> a Program with a pending entry

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, when: float, kind: TimerKind, payload: int | str) -> None:
        """An entry about ``payload`` (a request handle's id, a target id: what ``pop_due`` hands back)."""
        heapq.heappush(self._heap, (when, kind._value_, next(self._seq), payload))

    def arm(self, program: Program, kind: TimerKind, when: float) -> None:
        """Make sure ``program`` hears from ``kind`` no later than ``when``."""
        due = program.timer_due
        pending = due.get(kind)
        if pending is not None and pending <= when:
            return
        due[kind] = when
        serial = program.serial
        self._programs[serial] = program
        heapq.heappush(self._heap, (when, kind._value_, next(self._seq), serial))

    def forget(self, program: Program) -> None:
        """The Program was released: its entries no longer keep it (they are dropped as they surface)."""
        if self._programs.pop(program.serial, None) is not None:
            program.timer_due = {}

    def fired(self, program: Program, kind: TimerKind, when: float) -> bool:
        """Whether a due entry is the Program's pending one (and clear it); older duplicates are not."""
        if program.timer_due.get(kind) != when:
            return False
        del program.timer_due[kind]
        if not program.timer_due:
            self._programs.pop(program.serial, None)
        return True

    def _payload(self, kind: int, payload: int | str) -> object | None:
        """What an entry is about: its Program (None once forgotten) or the payload it was added with."""
        return self._programs.get(payload) if kind in PROGRAM_KINDS else payload  # type: ignore[arg-type]

    def pop_due(self, now: float) -> list[Due]:
        """Every entry due at ``now``, in (time, kind) order (a forgotten Program's are dropped)."""
        heap = self._heap
        out: list[Due] = []
        while heap and heap[0][0] <= now:
            when, kind, _, payload = heapq.heappop(heap)
            item = self._payload(kind, payload)
            if item is not None:
                out.append((when, _KINDS[kind], item))
        return out

    def compact(self, still_valid: Callable[[float, TimerKind, object], bool]) -> None:
        """Drop every stale entry once the heap has doubled since the last compaction (amortised O(1) per
        entry), not only those at the top: Programs released long before their entries fall due (a capped
        retention, a cancelled wait) would otherwise stay referenced until then."""
        if len(self._heap) <= 2 * self._floor + 1024:
            return
        kept, of = [], self._payload
        for entry in self._heap:
            when, kind, _, payload = entry
            item = of(kind, payload)
            if item is not None and still_valid(when, _KINDS[kind], item):
                kept.append(entry)
        heapq.heapify(kept)
        self._heap = kept
        self._floor = len(self._heap)

    def _valid(
        self,
        when: float,
        kind: int,
        payload: int | str,
        still_valid: Callable[[float, TimerKind, object], bool],
    ) -> bool:
        item = self._payload(kind, payload)
        return item is not None and still_valid(when, _KINDS[kind], item)

    def next_time(self, still_valid: Callable[[float, TimerKind, object], bool]) -> float | None:
        """The earliest entry that still matters, discarding stale ones from the top."""
        heap = self._heap
        while heap:
            when, kind, _, payload = heap[0]
            if self._valid(when, kind, payload, still_valid):
                return when
            heapq.heappop(heap)
        return None
