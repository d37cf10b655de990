"""Rank queues: the Paused Programs with retained requests, per last Rank, in resume order. Keeping only.

A queue holds sorted keys (resume.py computes them) and the Programs' ``QueueEntry`` records, which this
module alone writes. Besides the order it keeps lower bounds of the queued Programs' demand and uncached
context, so a scheduling pass can tell in O(1) that nobody unforced fits. ``RankQueues`` also remembers
puts a Rank on the scheduler's agenda whenever a Program is queued or re-keyed there.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING

from progrouter.program.records import QueueEntry, QueueKey

if TYPE_CHECKING:
    from progrouter.program.agenda import Agenda
    from progrouter.program.state import Program


class _LazyMin:
    """Min-heap of one value per queued Program, deleted lazily: a value counts while its Program still
    sits in the queue under the entry it was pushed with."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, QueueEntry]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, value: int, entry: QueueEntry) -> None:
        heapq.heappush(self._heap, (value, entry.key[-1], entry))

    def rebuild(self, values: list[tuple[int, int, QueueEntry]]) -> None:
        heapq.heapify(values)
        self._heap = values

    def min(self, programs: dict[int, Program]) -> int | None:
        heap = self._heap
        while heap:
            value, serial, entry = heap[0]
            program = programs.get(serial)
            if program is not None and program.queue_entry is entry:
                return value
            heapq.heappop(heap)
        return None


class RankQueue:
    """The Paused Programs with retained requests whose last Rank is this one, in resume order.

    Besides the ordered keys it keeps lower bounds of the queued Programs' demand and uncached context, so
    a pass can tell in O(1) that no unforced candidate can be admitted and stop without planning each one.
    """

    __slots__ = ("_demand", "_keys", "_programs", "_uncached", "pending")

    def __init__(self) -> None:
        self._keys: list[QueueKey] = []
        self._programs: dict[int, Program] = {}  # serial -> Program
        self._demand = _LazyMin()  # private tokens required
        self._uncached = _LazyMin()  # context beyond the shared prefix (what a cold start recomputes)
        self.pending: dict[Program, None] = {}  # queued or re-keyed since the last scheduling pass

    def __len__(self) -> int:
        return len(self._keys)

    def insert(self, program: Program, entry: QueueEntry) -> None:
        program.queue_entry = entry
        key = entry.key
        bisect.insort(self._keys, key)
        self._programs[key[-1]] = program
        self._demand.push(entry.required, entry)
        self._uncached.push(entry.uncached, entry)
        if len(self._demand) > 2 * len(self._keys) + 32:
            live = [e for e in (p.queue_entry for p in self._programs.values()) if e is not None]
            self._demand.rebuild([(e.required, e.key[-1], e) for e in live])
            self._uncached.rebuild([(e.uncached, e.key[-1], e) for e in live])
        self.pending[program] = None

    def remove(self, program: Program) -> None:
        entry = program.queue_entry
        assert entry is not None
        key = entry.key
        i = bisect.bisect_left(self._keys, key)
        del self._keys[i]
        del self._programs[key[-1]]
        self.pending.pop(program, None)
        program.queue_entry = None

    def ahead_of(self, key: QueueKey) -> int:
        """How many queued Programs order before ``key``."""
        return bisect.bisect_left(self._keys, key)

    def ordered(self) -> list[Program]:
        programs = self._programs
        return [programs[key[-1]] for key in self._keys]

    def iter_ordered(self) -> Iterator[Program]:
        """In resume order, without copying; stop iterating once the queue changes."""
        programs = self._programs
        for key in self._keys:
            yield programs[key[-1]]

    def first(self) -> Program | None:
        return self._programs[self._keys[0][-1]] if self._keys else None

    def min_required(self) -> int:
        """A lower bound of the queued Programs' demands (0 when empty)."""
        return self._demand.min(self._programs) or 0

    def min_uncached(self) -> int:
        """A lower bound of the queued Programs' uncached contexts (0 when empty)."""
        return self._uncached.min(self._programs) or 0

    def take_pending(self) -> list[Program]:
        pending = sorted(self.pending, key=_queue_key)
        self.pending.clear()
        return pending


def _queue_key(program: Program) -> QueueKey:
    entry = program.queue_entry
    assert entry is not None
    return entry.key


class RankQueues:
    """Rank queues by target id, plus which Ranks have pending (unplanned) candidates."""

    __slots__ = ("_agenda", "_pool_keys", "_queues")

    def __init__(self, agenda: Agenda, *, pool_order: bool) -> None:
        self._queues: dict[str, RankQueue] = {}
        self._agenda = agenda
        # global_queue: every waiter of a pool in one resume order, to count the waiters ahead cheaply
        self._pool_keys: dict[str, list[QueueKey]] | None = {} if pool_order else None

    def ahead_in_pool(self, model_pool: str, key: QueueKey) -> int:
        keys = None if self._pool_keys is None else self._pool_keys.get(model_pool)
        return 0 if keys is None else bisect.bisect_left(keys, key)

    def get(self, target_id: str) -> RankQueue | None:
        return self._queues.get(target_id)

    def size(self, target_id: str) -> int:
        queue = self._queues.get(target_id)
        return 0 if queue is None else len(queue)

    def insert(self, program: Program, entry: QueueEntry) -> None:
        target = program.last_target
        assert target is not None and program.queue_entry is None
        queue = self._queues.get(target)
        if queue is None:
            queue = self._queues[target] = RankQueue()
        queue.insert(program, entry)
        key = entry.key
        self._agenda.candidates_arrived(target)
        if self._pool_keys is not None:
            bisect.insort(self._pool_keys.setdefault(program.ref.model_pool, []), key)

    def remove(self, program: Program) -> None:
        key = program.queue_key
        if key is None:
            return
        target = program.last_target
        assert target is not None
        self._queues[target].remove(program)
        self._forget_pool_key(program, key)

    def _forget_pool_key(self, program: Program, key: QueueKey) -> None:
        if self._pool_keys is not None:
            keys = self._pool_keys[program.ref.model_pool]
            del keys[bisect.bisect_left(keys, key)]

    def drop_target(self, target_id: str) -> list[Program]:
        """Empty a Rank's queue (it left); returns its Programs in order."""
        queue = self._queues.pop(target_id, None)
        if queue is None:
            return []
        programs = queue.ordered()
        for program in programs:
            assert program.queue_key is not None
            self._forget_pool_key(program, program.queue_key)
            program.queue_entry = None
        return programs
