"""Rank queues: the Paused Programs with retained requests, per last Rank, in resume order. Keeping only.

A queue holds sorted keys (resume.py computes them) in blocks and the Programs' ``QueueEntry`` records,
which this module alone writes. Each block knows the least demand, uncached context and force deadline of
its entries, so a scheduling pass skips a block none of whose candidates can be admitted, and tells from
the least of all that nobody unforced fits. ``RankQueues`` puts a Rank on the scheduler's agenda whenever a
Program is queued or re-keyed there.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from progrouter.program.core.records import QueueEntry, QueueKey

if TYPE_CHECKING:
    from progrouter.program.core.agenda import Agenda
    from progrouter.program.core.state import Program


#: Keys per block of a Rank queue: a block splits past twice this (a pass skips whole blocks, see below).
BLOCK_KEYS = 32


class _Block:
    """A run of consecutive keys of one queue, with its entries' demand, uncached context and force deadline
    side by side, and the least of each, so a scheduling pass can skip the whole run when none of its
    candidates can be admitted."""

    __slots__ = ("deadlines", "demands", "forced_at", "keys", "required", "uncached", "uncacheds")

    def __init__(
        self, keys: list[QueueKey], demands: list[int], uncacheds: list[int], deadlines: list[float]
    ) -> None:
        self._hold(keys, demands, uncacheds, deadlines)

    def _hold(
        self, keys: list[QueueKey], demands: list[int], uncacheds: list[int], deadlines: list[float]
    ) -> None:
        self.keys = keys
        self.demands = demands
        self.uncacheds = uncacheds
        self.deadlines = deadlines
        self.required = min(demands)
        self.uncached = min(uncacheds)
        self.forced_at = min(deadlines)

    def add(self, entry: QueueEntry) -> None:
        i = bisect.bisect_right(self.keys, entry.key)
        self.keys.insert(i, entry.key)
        self.demands.insert(i, entry.required)
        self.uncacheds.insert(i, entry.uncached)
        self.deadlines.insert(i, entry.forced_at)
        if entry.required < self.required:
            self.required = entry.required
        if entry.uncached < self.uncached:
            self.uncached = entry.uncached
        if entry.forced_at < self.forced_at:
            self.forced_at = entry.forced_at

    def discard(self, entry: QueueEntry) -> None:
        """Take ``entry`` out (the block keeps at least one key); a least value it held is found again."""
        i = bisect.bisect_left(self.keys, entry.key)
        del self.keys[i], self.demands[i], self.uncacheds[i], self.deadlines[i]
        if entry.required == self.required:
            self.required = min(self.demands)
        if entry.uncached == self.uncached:
            self.uncached = min(self.uncacheds)
        if entry.forced_at == self.forced_at:
            self.forced_at = min(self.deadlines)

    def split(self) -> _Block:
        """Keep the first ``BLOCK_KEYS`` keys; returns a block of the rest."""
        n = BLOCK_KEYS
        tail = _Block(self.keys[n:], self.demands[n:], self.uncacheds[n:], self.deadlines[n:])
        self._hold(self.keys[:n], self.demands[:n], self.uncacheds[:n], self.deadlines[:n])
        return tail


class RankQueue:
    """The Paused Programs with retained requests whose last Rank is this one, in resume order.

    The ordered keys are kept in blocks of about ``BLOCK_KEYS`` (a sorted list of sorted runs), each with
    the least demand, uncached context and force deadline among its entries. A scheduling pass walks the
    queue in order and skips every block whose bounds say none of its candidates can be admitted, so a
    long queue that cannot move costs O(blocks), not O(Programs).
    """

    __slots__ = ("_blocks", "_bounds", "_entries", "_len", "_maxes", "_programs", "pending")

    def __init__(self) -> None:
        self._blocks: list[_Block] = []
        self._maxes: list[QueueKey] = []  # the last key of each block
        self._programs: dict[int, Program] = {}  # serial -> Program
        self._entries: dict[Program, QueueEntry] = {}  # each queued Program's entry: this queue's own
        self._len = 0
        self._bounds: tuple[int, int, float] | None = None  # ``bounds()``, until a least value leaves
        self.pending: dict[Program, None] = {}  # queued or re-keyed since the last scheduling pass

    def __len__(self) -> int:
        return self._len

    def entry(self, program: Program) -> QueueEntry | None:
        """``program``'s entry, if it is queued here."""
        return self._entries.get(program)

    def insert(self, program: Program, entry: QueueEntry) -> None:
        self._entries[program] = entry
        key = entry.key
        self._programs[key[-1]] = program
        self._len += 1
        self.pending[program] = None
        bounds = self._bounds
        if bounds is not None:  # the least of each (as ``min`` keeps them: the first unless one is less)
            required, uncached, forced_at = bounds
            if entry.required < required or entry.uncached < uncached or entry.forced_at < forced_at:
                self._bounds = (
                    entry.required if entry.required < required else required,
                    entry.uncached if entry.uncached < uncached else uncached,
                    entry.forced_at if entry.forced_at < forced_at else forced_at,
                )
        blocks, maxes = self._blocks, self._maxes
        if not blocks:
            blocks.append(_Block([key], [entry.required], [entry.uncached], [entry.forced_at]))
            maxes.append(key)
            return
        i = min(bisect.bisect_left(maxes, key), len(blocks) - 1)
        block = blocks[i]
        block.add(entry)
        if len(block.keys) > 2 * BLOCK_KEYS:
            blocks.insert(i + 1, block.split())
            maxes.insert(i + 1, blocks[i + 1].keys[-1])
        maxes[i] = block.keys[-1]

    def remove(self, program: Program) -> None:
        entry = self._entries.pop(program)
        key = entry.key
        i = bisect.bisect_left(self._maxes, key)
        block = self._blocks[i]
        del self._programs[key[-1]]
        self._len -= 1
        self.pending.pop(program, None)
        bounds = self._bounds
        if bounds is not None and (
            entry.required == bounds[0] or entry.uncached == bounds[1] or entry.forced_at == bounds[2]
        ):
            self._bounds = None
        if len(block.keys) == 1:
            del self._blocks[i]
            del self._maxes[i]
            return
        block.discard(entry)
        self._maxes[i] = block.keys[-1]

    def ahead_of(self, key: QueueKey) -> int:
        """How many queued Programs order before ``key``."""
        i = bisect.bisect_left(self._maxes, key)
        before = sum(len(b.keys) for b in self._blocks[:i])
        return before + (bisect.bisect_left(self._blocks[i].keys, key) if i < len(self._blocks) else 0)

    def ordered(self) -> list[Program]:
        programs = self._programs
        return [programs[key[-1]] for block in self._blocks for key in block.keys]

    def entries(
        self, hopeless: Callable[[int, int, float], bool] | None = None
    ) -> Iterator[tuple[QueueKey, int, int, float]]:
        """The queued entries' fields (``QueueEntry``'s) in resume order, without copying; stop iterating
        once the queue changes.
        ``hopeless(least demand, least uncached context, earliest force deadline)`` skips every block it is
        True for."""
        for block in self._blocks:
            if hopeless is not None and hopeless(block.required, block.uncached, block.forced_at):
                continue
            yield from zip(block.keys, block.demands, block.uncacheds, block.deadlines, strict=True)

    def program(self, key: QueueKey) -> Program:
        """The queued Program under ``key``."""
        return self._programs[key[-1]]

    def first(self) -> Program | None:
        return self._programs[self._blocks[0].keys[0][-1]] if self._blocks else None

    def bounds(self) -> tuple[int, int, float]:
        """The least demand, least uncached context and earliest force deadline of the whole queue (its
        blocks' bounds; 0, 0, inf when empty), kept until an entry holding one of them leaves."""
        if self._bounds is not None:
            return self._bounds
        blocks = self._blocks
        if not blocks:
            return 0, 0, math.inf
        first = blocks[0]
        required, uncached, forced_at = first.required, first.uncached, first.forced_at
        for block in blocks:
            if block.required < required:
                required = block.required
            if block.uncached < uncached:
                uncached = block.uncached
            if block.forced_at < forced_at:
                forced_at = block.forced_at
        self._bounds = (required, uncached, forced_at)
        return self._bounds

    def min_required(self) -> int:
        """The least demand among the queued Programs (0 when empty)."""
        return self.bounds()[0]

    def min_uncached(self) -> int:
        """The least uncached context among the queued Programs (0 when empty)."""
        return self.bounds()[1]

    def take_pending(self) -> list[Program]:
        """The Programs queued or re-keyed since the last pass, in the order they were (a pass sorts their
        entries only if the count guard leaves it anything to plan)."""
        pending = list(self.pending)
        self.pending.clear()
        return pending


#: Keys per run of a pool's key order: a run splits past twice this (an insertion moves one run, not all).
RUN_KEYS = 256


class _KeyOrder:
    """Every waiter of a model pool in one resume order, to count the waiters ahead of a key: sorted runs of
    at most ``2 × RUN_KEYS`` keys (a sorted list of sorted lists), so a queueing or an admission moves one
    run of pointers instead of the whole list."""

    __slots__ = ("_len", "_maxes", "_runs")

    def __init__(self) -> None:
        self._runs: list[list[QueueKey]] = []
        self._maxes: list[QueueKey] = []  # the last key of each run
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def insert(self, key: QueueKey) -> None:
        runs, maxes = self._runs, self._maxes
        self._len += 1
        if not runs:
            runs.append([key])
            maxes.append(key)
            return
        i = min(bisect.bisect_left(maxes, key), len(runs) - 1)
        run = runs[i]
        bisect.insort(run, key)
        maxes[i] = run[-1]
        if len(run) > 2 * RUN_KEYS:
            tail = run[RUN_KEYS:]
            del run[RUN_KEYS:]
            runs.insert(i + 1, tail)
            maxes[i] = run[-1]
            maxes.insert(i + 1, tail[-1])

    def remove(self, key: QueueKey) -> None:
        runs, maxes = self._runs, self._maxes
        i = bisect.bisect_left(maxes, key)
        run = runs[i]
        del run[bisect.bisect_left(run, key)]
        self._len -= 1
        if run:
            maxes[i] = run[-1]
        else:
            del runs[i], maxes[i]

    def ahead_of(self, key: QueueKey) -> int:
        """How many keys order before ``key``."""
        runs = self._runs
        i = bisect.bisect_left(self._maxes, key)
        return sum(map(len, runs[:i])) + (bisect.bisect_left(runs[i], key) if i < len(runs) else 0)


class RankQueues:
    """Rank queues by rank id, plus which Ranks have pending (unplanned) candidates."""

    __slots__ = ("_agenda", "_pool_keys", "_queues")

    def __init__(self, agenda: Agenda, *, pool_order: bool) -> None:
        self._queues: dict[str, RankQueue] = {}
        self._agenda = agenda
        # global_queue: every waiter of a pool in one resume order, to count the waiters ahead cheaply
        self._pool_keys: dict[str, _KeyOrder] | None = {} if pool_order else None

    def ahead_in_pool(self, model_pool: str, key: QueueKey) -> int:
        keys = None if self._pool_keys is None else self._pool_keys.get(model_pool)
        return 0 if keys is None else keys.ahead_of(key)

    def pool_waiting(self, model_pool: str) -> int:
        """Waiters of a pool over all its Ranks (``global_queue`` only; 0 otherwise)."""
        keys = None if self._pool_keys is None else self._pool_keys.get(model_pool)
        return 0 if keys is None else len(keys)

    def get(self, rank_id: str) -> RankQueue | None:
        return self._queues.get(rank_id)

    def size(self, rank_id: str) -> int:
        queue = self._queues.get(rank_id)
        return 0 if queue is None else len(queue)

    def entry(self, program: Program) -> QueueEntry | None:
        """``program``'s entry (its key, frozen demand, uncached context, force deadline) while it waits in
        its last Rank's queue; None when it is not queued."""
        rank_id = program.last_rank
        queue = None if rank_id is None else self._queues.get(rank_id)
        return None if queue is None else queue._entries.get(program)

    def key(self, program: Program) -> QueueKey | None:
        """``program``'s place in its queue, None when it is not queued."""
        entry = self.entry(program)
        return None if entry is None else entry.key

    def insert(self, program: Program, entry: QueueEntry) -> None:
        rank_id = program.last_rank
        assert rank_id is not None and self.entry(program) is None
        queue = self._queues.get(rank_id)
        if queue is None:
            queue = self._queues[rank_id] = RankQueue()
        queue.insert(program, entry)
        key = entry.key
        self._agenda.candidates_arrived(rank_id)
        if self._pool_keys is not None:
            keys = self._pool_keys.get(program.ref.model_pool)
            if keys is None:
                keys = self._pool_keys[program.ref.model_pool] = _KeyOrder()
            keys.insert(key)

    def remove(self, program: Program) -> None:
        entry = self.entry(program)
        if entry is None:
            return
        rank_id = program.last_rank
        assert rank_id is not None
        self._queues[rank_id].remove(program)
        self._forget_pool_key(program, entry.key)

    def _forget_pool_key(self, program: Program, key: QueueKey) -> None:
        if self._pool_keys is not None:
            self._pool_keys[program.ref.model_pool].remove(key)

    def drop_rank(self, rank_id: str) -> list[Program]:
        """Empty a Rank's queue (it left); returns its Programs in order."""
        queue = self._queues.pop(rank_id, None)
        if queue is None:
            return []
        programs = queue.ordered()
        for program in programs:
            self._forget_pool_key(program, queue._entries[program].key)
        return programs
