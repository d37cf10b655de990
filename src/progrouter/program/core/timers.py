"""The scheduler's clock-driven work, kept in one heap so ``next_deadline`` and each event are O(log n).

Entries are never removed when they become moot (a Program resumed before its force deadline, a request was
dispatched before its queue timeout): the scheduler checks each due entry against the current facts and
drops stale ones. ``next_deadline`` may therefore name a time at which nothing turns out to be due; that
costs one early tick, never a missed one. A Program has at most one pending entry per kind (``arm``): when
its due time moves later, the earlier entry fires, finds the new time and re-arms, so Programs that pause
and queue again and again never pile entries up: an entry that is moot now (its Program was admitted before
its force deadline, resumed before its retention ran out) stays its Program's pending one, and serves the
next wait, pause or TTL as the earlier entry. A Program's entries hold only its serial: the Program is kept
here while it has a pending entry, and its release lets go of it at once (``forget``), however long its
entries take to surface.

A heap entry is one int, ``(when, kind, sequence)`` packed so that ints order as those tuples do, and its
payload (a Program's serial, a request handle's id, a target id) and due time sit in two dicts under its
sequence number. Nothing an entry needs is an object the cyclic garbage collector tracks: the entries that
wait for minutes (queue timeouts, retention, force deadlines), most of them long moot, no longer count
towards its collections, and those had been nearly all the growth that set them off.
"""

from __future__ import annotations

import heapq
import itertools
import struct
from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from progrouter.program.core.state import Program


class TimerKind(IntEnum):
    """At equal times, lower kinds are handled first (a force resume before a queue timeout)."""

    ACTING_TTL = 0
    PAUSED_RETENTION = 1
    OBSERVATION_STALE = 2
    FORCE_RESUME = 3
    QUEUE_TIMEOUT = 4


#: The kinds as plain globals, for the modules that arm and dispatch timers on every event (an enum member
#: read through its class is slow on CPython 3.11: see ``state.ACTIVE``).
ACTING_TTL, PAUSED_RETENTION = TimerKind.ACTING_TTL, TimerKind.PAUSED_RETENTION
OBSERVATION_STALE, FORCE_RESUME, QUEUE_TIMEOUT = (
    TimerKind.OBSERVATION_STALE,
    TimerKind.FORCE_RESUME,
    TimerKind.QUEUE_TIMEOUT,
)

Due = tuple[float, TimerKind, object]

#: kinds whose entries are a Program's (the heap holds its serial)
PROGRAM_KINDS = frozenset({TimerKind.ACTING_TTL, TimerKind.PAUSED_RETENTION, TimerKind.FORCE_RESUME})
_KINDS = tuple(TimerKind)  # by number

_F64 = struct.Struct(">d").pack
_U64 = struct.Struct(">Q").unpack
_SIGN = 1 << 63
_BITS = (1 << 64) - 1
_LOW = 67  # an entry's low bits: its kind (3 bits) above its sequence number (64 bits)
_SEQUENCE = (1 << 64) - 1


def _order(when: float) -> int:
    """A non-negative int that orders as ``when`` does (its IEEE 754 bits, negative values flipped; −0.0
    counts as 0.0, as it compares)."""
    bits: int = _U64(_F64(when + 0.0))[0]
    return bits ^ _BITS if bits & _SIGN else bits | _SIGN


class Timers:
    __slots__ = ("_due", "_floor", "_heap", "_payloads", "_programs", "_seq", "_whens")

    def __init__(self) -> None:
        self._heap: list[int] = []  # _order(when) << _LOW | kind << 64 | sequence
        self._whens: dict[int, float] = {}  # sequence -> due time
        self._payloads: dict[int, int | str] = {}  # sequence -> serial, handle id or rank id
        self._seq = itertools.count()
        self._floor = 0  # entries left by the last compaction (all valid then)
        self._programs: dict[int, Program] = {}  # serial -> a Program with a pending entry
        self._due: dict[int, dict[int, float]] = {}  # serial -> kind -> its one pending entry's due time

    def __len__(self) -> int:
        return len(self._heap)

    def _push(self, when: float, kind: TimerKind, payload: int | str) -> None:
        seq = next(self._seq)
        self._whens[seq] = when
        self._payloads[seq] = payload
        heapq.heappush(self._heap, _order(when) << _LOW | kind._value_ << 64 | seq)

    def _take(self, entry: int) -> tuple[float, int, int | str]:
        """Forget a popped or dropped entry: its due time, kind's number and payload."""
        seq = entry & _SEQUENCE
        return self._whens.pop(seq), entry >> 64 & 7, self._payloads.pop(seq)

    def add(self, when: float, kind: TimerKind, payload: int | str) -> None:
        """An entry about ``payload`` (a request handle's id, a rank id: what ``pop_due`` hands back)."""
        self._push(when, kind, payload)

    def arm(self, program: Program, kind: TimerKind, when: float) -> None:
        """Make sure ``program`` hears from ``kind`` no later than ``when``."""
        serial = program.serial
        due = self._due.get(serial)
        if due is None:
            due = self._due[serial] = {}
        pending = due.get(kind)
        if pending is not None and pending <= when:
            return
        due[kind] = when
        self._programs[serial] = program
        self._push(when, kind, serial)

    def forget(self, program: Program) -> None:
        """The Program was released: its entries no longer keep it (they are dropped as they surface)."""
        if self._programs.pop(program.serial, None) is not None:
            del self._due[program.serial]

    def fired(self, program: Program, kind: TimerKind, when: float) -> bool:
        """Whether a due entry is the Program's pending one (and clear it); older duplicates are not."""
        serial = program.serial
        due = self._due.get(serial)
        if due is None or due.get(kind) != when:
            return False
        del due[kind]
        if not due:
            del self._due[serial]
            self._programs.pop(serial, None)
        return True

    def due(self, program: Program, kind: TimerKind) -> float | None:
        """When ``program``'s pending entry of ``kind`` falls due (None: it has none)."""
        due = self._due.get(program.serial)
        return None if due is None else due.get(kind)

    def _payload(self, kind: int, payload: int | str) -> object | None:
        """What an entry is about: its Program (None once forgotten) or the payload it was added with."""
        return self._programs.get(payload) if kind in PROGRAM_KINDS else payload  # type: ignore[arg-type]

    def pop_due(self, now: float) -> list[Due]:
        """Every entry due at ``now``, in (time, kind) order (a forgotten Program's are dropped)."""
        heap, whens = self._heap, self._whens
        out: list[Due] = []
        while heap and whens[heap[0] & _SEQUENCE] <= now:
            when, kind, payload = self._take(heapq.heappop(heap))
            item = self._payload(kind, payload)
            if item is not None:
                out.append((when, _KINDS[kind], item))
        return out

    def compact(self, still_valid: Callable[[float, TimerKind, object], bool]) -> None:
        """Drop every stale entry once the heap has doubled since the last compaction (amortised O(1) per
        entry), not only those at the top: a Program's entry that is no longer its pending one (released,
        re-armed earlier), and any other the scheduler finds moot (``still_valid``). A Program's pending
        entry stays, moot or not: it is the one ``arm`` relies on (at most one per Program and kind)."""
        if len(self._heap) <= 2 * self._floor + 1024:
            return
        kept, whens, payloads, programs = [], self._whens, self._payloads, self._programs
        for entry in self._heap:
            seq = entry & _SEQUENCE
            kind = entry >> 64 & 7
            when, payload = whens[seq], payloads[seq]
            if kind in PROGRAM_KINDS:
                program = programs.get(payload)  # type: ignore[arg-type]
                keep = program is not None and self._due[program.serial].get(kind) == when
            else:
                keep = still_valid(when, _KINDS[kind], payload)
            if keep:
                kept.append(entry)
            else:
                del whens[seq], payloads[seq]
        heapq.heapify(kept)
        self._heap = kept
        self._floor = len(self._heap)

    def next_time(self, still_valid: Callable[[float, TimerKind, object], bool]) -> float | None:
        """The earliest entry that still matters, discarding stale ones from the top."""
        heap = self._heap
        while heap:
            seq = heap[0] & _SEQUENCE
            kind = heap[0] >> 64 & 7
            when = self._whens[seq]
            item = self._payload(kind, self._payloads[seq])
            if item is not None and still_valid(when, _KINDS[kind], item):
                return when
            self._take(heapq.heappop(heap))
        return None
