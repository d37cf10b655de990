"""``ProgramTable``: every Program of every model pool, its generations and the per-Rank indexes; the only
writer of a Program's phase and placement (state.py's rules).

Capacity follows placement: activating charges the ledger, every way out of Active (pause, invalidate,
release) discharges it, so the ledger cannot drift from the states.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

from mypy_extensions import mypyc_attr

from progrouter.program.core.state import (
    _ACTIVATE,
    _IDLE,
    _PAUSE,
    _RETAIN,
    ACTING,
    ACTIVE,
    PAUSED,
    REASONING,
    TRANSITIONS,
    Event,
    IllegalTransition,
    Program,
    ProgramRef,
    ProgramState,
    ProgramStatus,
    RankPrograms,
)

if TYPE_CHECKING:
    from progrouter.program.core.ledger import CapacityLedger
    from progrouter.program.core.records import LifecycleRecord
    from progrouter.program.core.request_pool import RequestPool


class _Row(Program):
    """A Program as the table holds it: the only class whose phase and placement can be assigned, built only
    by ``materialize``; everyone else holds it as a ``Program``, whose same names are read-only properties
    (these slots shadow them: plain, a read costs what a slot costs; compiled, one native getter call)."""

    __slots__ = (
        "estimated_context_tokens",
        "home_rank",
        "in_flight",
        "last_cache_miss_impact_seconds",
        "last_rank",
        "pause_when_idle",
        "placement",
        "placement_epoch",
        "placement_start_pending",
        "rounds_since_activation",
        "state",
        "status",
    )

    def __init__(
        self,
        ref: ProgramRef,
        serial: int,
        redacted: str,
        created_at: float,
        lifecycle: LifecycleRecord,
        home: str | None,
    ) -> None:
        super().__init__(ref, serial, redacted, created_at, lifecycle)
        self.state: ProgramState = PAUSED
        self.status: ProgramStatus = REASONING
        self.placement: str | None = None
        self.placement_epoch: int = 0
        self.placement_start_pending: bool = False
        self.in_flight: int = 0
        self.home_rank: str | None = home
        self.last_rank: str | None = None
        self.rounds_since_activation: int = 0
        self.estimated_context_tokens: int = 0
        self.last_cache_miss_impact_seconds: float = 0.0
        self.pause_when_idle: bool = False


@mypyc_attr(native_class=False)  # compiled, a dict subclass must stay a plain class
class _Ranks(dict[str, RankPrograms]):
    """Rank indexes by rank id, each made on first use (a hit costs one dict lookup, no call)."""

    __slots__ = ("_max_rounds",)

    def __init__(self, max_rounds: int) -> None:
        super().__init__()
        self._max_rounds = max_rounds

    def __missing__(self, rank_id: str) -> RankPrograms:
        ranks = self[rank_id] = RankPrograms(self._max_rounds)
        return ranks


class ProgramTable:
    """The Programs of every model pool, their generations and per-Rank indexes."""

    def __init__(
        self, ledger: CapacityLedger, request_pool: RequestPool, max_rounds: int, fence_size: int
    ) -> None:
        self._ledger = ledger
        self._request_pool = request_pool
        self._max_rounds = max_rounds
        self._programs: dict[tuple[str, str], Program] = {}
        # The last generation of the ``fence_size`` most recently released Programs, oldest first: a
        # returning id continues its numbering; older ones start again at 0 (epochs keep completions safe).
        self._fence_size = fence_size
        self._released: dict[tuple[str, str], int] = {}
        self.ranks = _Ranks(max_rounds)  # rank id -> its indexes, made on first use: read-only outside
        self._unbound: dict[str, dict[Program, None]] = {}  # model pool -> Programs with no live Rank
        self._serials = itertools.count()
        self._epochs = itertools.count(1)

    # ------------------------------------------------------------------------------------------ lookups
    def __len__(self) -> int:
        return len(self._programs)

    def __iter__(self) -> Iterator[Program]:
        return iter(self._programs.values())

    def get(self, model_pool: str, program_id: str) -> Program | None:
        return self._programs.get((model_pool, program_id))

    def lookup(self, ref: ProgramRef) -> Program | None:
        """The live Program of exactly this generation, or None (released or replaced)."""
        program = self._programs.get((ref.model_pool, ref.program_id))
        return program if program is not None and program.ref.generation == ref.generation else None

    def peek_rank(self, rank_id: str) -> RankPrograms:
        """A Rank's indexes for reading only: an unknown Rank reads as empty and stays unknown."""
        ranks = self.ranks.get(rank_id)
        return ranks if ranks is not None else RankPrograms(self._max_rounds)

    def unbound(self, model_pool: str) -> list[Program]:
        return list(self._unbound.get(model_pool, ()))

    def forget_rank(self, rank_id: str) -> None:
        """Drop the indexes of a Rank that left every pool (its Programs were moved already)."""
        ranks = self.ranks.get(rank_id)
        if ranks is not None and not ranks.attributed and not ranks.active_count:
            del self.ranks[rank_id]

    # ---------------------------------------------------------------------------------------- lifecycle
    def materialize(
        self, now: float, model_pool: str, lifecycle: LifecycleRecord, home: str | None
    ) -> Program:
        """A new generation, Paused+Reasoning, bound to ``home`` (None when the pool has no Rank), carrying
        the lifecycle's record (``Lifecycle.new_record``) of its first request."""
        program_id = lifecycle.identity.program_id
        key = (model_pool, program_id)
        if key in self._programs:
            raise IllegalTransition(f"a generation of {key!r} is live already")
        previous = self._released.pop(key, None)
        generation = 0 if previous is None else previous + 1
        ref = ProgramRef(model_pool, program_id, generation)
        program = _Row(ref, next(self._serials), ref.redacted_id(), now, lifecycle, home)
        self._programs[key] = program
        self._attribute(program, home)
        return program

    @property
    def fenced(self) -> int:
        """Released Programs whose generation number is remembered (at most ``fence_size``)."""
        return len(self._released)

    def retain(self, program: Program) -> None:
        """A request arrived: the Program is Reasoning until it is idle again."""
        self._move(program, _RETAIN)

    def activate(self, program: Program, rank_id: str, tokens: int, *, overflow: bool = False) -> None:
        """Paused+Reasoning → Active+Reasoning on ``rank_id``, charging ``tokens`` of logical capacity;
        ``overflow``: a forced resume past the Rank's limits (at most one per Rank at a time)."""
        row = cast(_Row, program)
        self._move(program, _ACTIVATE)
        row.placement = rank_id
        row.placement_epoch = next(self._epochs)
        row.placement_start_pending = True
        row.rounds_since_activation = 0
        self._attribute(program, rank_id)
        rank = self.ranks[rank_id]
        rank.reasoning[program] = None
        rank.active_count += 1
        rank.reasoning_context += row.estimated_context_tokens
        rank._enter(program)
        if overflow:
            rank.overflow = program
        self._ledger.charge(program, rank_id, tokens)

    def count_completion(self, program: Program, seconds: float, *, round_served: bool) -> None:
        """A successful completion: one more continuous round since activation if ``round_served``, and
        ``seconds``, its cache-miss impact. The Rank's round histogram moves once, with the same float
        operations in the same order as leaving and entering it for each fact in turn (so its sums are
        bit for bit what two moves give)."""
        row = cast(_Row, program)
        old = row.last_cache_miss_impact_seconds
        rounds_since = row.rounds_since_activation
        row.last_cache_miss_impact_seconds = seconds
        if round_served:
            row.rounds_since_activation = rounds_since + 1
        rank_id = row.placement
        if rank_id is None:
            return
        rank = self.ranks[rank_id]
        rounds, impacts, top = rank.rounds, rank.impacts, rank._top
        b = rounds_since if rounds_since < top else top
        if round_served:  # leave the old bucket, enter the next with the old impact
            left = rounds[b] - 1
            rounds[b] = left
            impacts[b] = impacts[b] - old if left else 0.0
            rounds_since += 1
            b = rounds_since if rounds_since < top else top
            others = rounds[b]
            impacts[b] += old
        else:
            others = rounds[b] - 1
        # leave with the old impact and enter with the new (the count is back where it was)
        impacts[b] = (impacts[b] - old if others else 0.0) + seconds
        rounds[b] = others + 1

    def set_context(self, program: Program, tokens: int) -> None:
        """The Program's context estimate (indexed while it is Active+Reasoning)."""
        row = cast(_Row, program)
        if row.placement is not None and row.status is REASONING:
            self.ranks[row.placement].reasoning_context += tokens - row.estimated_context_tokens
        row.estimated_context_tokens = tokens

    def dispatched(self, program: Program) -> bool:
        """A request of an Active Program starts; returns whether it is the first of its placement."""
        row = cast(_Row, program)
        if row.state is not ACTIVE:
            raise IllegalTransition(f"dispatch of a {row.state} Program")
        row.in_flight += 1
        first = row.placement_start_pending
        row.placement_start_pending = False
        return first

    def request_finished(self, program: Program) -> bool:
        """A dispatched request ended; returns whether the Program became idle (→ Acting)."""
        row = cast(_Row, program)
        if row.in_flight <= 0:
            raise IllegalTransition("completion with nothing in flight")
        row.in_flight -= 1
        return self._idle_if_quiet(program)

    def request_withdrawn(self, program: Program) -> bool:
        """A retained request left the pool unserved (cancel, timeout); returns whether the Program idled."""
        return self._idle_if_quiet(program)

    def pause(self, program: Program) -> str:
        """Active+Acting → Paused+Acting; returns the Rank it left."""
        rank_id = program.placement
        assert rank_id is not None
        self._move(program, _PAUSE)
        self._leave_placement(program, rank_id)
        return rank_id

    def invalidate(self, program: Program) -> str | None:
        """The placement Rank vanished: → Paused; in-flight requests are forgotten (completions stale)."""
        row = cast(_Row, program)
        rank_id = row.placement
        if rank_id is None:
            return None
        self._move(program, Event.INVALIDATE)
        self._leave_placement(program, rank_id)
        row.in_flight = 0
        row.placement_epoch = next(self._epochs)
        self._idle_if_quiet(program)
        return rank_id

    def release(self, program: Program) -> None:
        """End the generation (idle only). An Active Program gives its capacity back first."""
        if program.in_flight or self._request_pool.waiting(program):
            raise IllegalTransition("release of a Program with requests in flight or retained")
        rank_id = program.placement
        self._move(program, Event.RELEASE)
        if rank_id is not None:
            self._leave_placement(program, rank_id)
        self._attribute(program, None, unbind=False)
        key = program.key
        del self._programs[key]
        self._released[key] = program.ref.generation
        if len(self._released) > self._fence_size:
            del self._released[next(iter(self._released))]

    def rebind(self, program: Program, rank_id: str | None) -> None:
        """A Paused Program's home and last Rank become ``rank_id`` (failover, or its pool came back)."""
        row = cast(_Row, program)
        if program.active:
            raise IllegalTransition("rebind of an Active Program")
        row.home_rank = rank_id
        self._attribute(program, rank_id)

    def set_marked(self, program: Program, marked: bool) -> None:
        """Capacity repair's deferred pause mark, indexed per Rank for the repair and segment-yield sums."""
        row = cast(_Row, program)
        row.pause_when_idle = marked
        if row.placement is None:
            return
        rank = self.ranks[row.placement]
        if marked:
            rank.marked[program] = None
        else:
            rank.marked.pop(program, None)

    # ------------------------------------------------------------------------------------------ helpers
    def _move(self, program: Program, event: Event) -> None:
        row = cast(_Row, program)
        before_state, before_status = row.state, row.status
        moves, before = TRANSITIONS[event], (before_state, before_status)
        if before not in moves:  # (not a sentinel compared by identity: compiled, a tuple is a new object)
            raise IllegalTransition(f"{event} is not allowed from {before_state}+{before_status}")
        after = moves[before]
        if after is None:
            return
        row.state, row.status = after
        if after[1] is before_status or before_state is not ACTIVE:
            return  # the Rank's Active indexes only change when an Active Program changes status
        rank_id = row.placement
        if rank_id is not None and after[0] is ACTIVE:
            rank = self.ranks[rank_id]
            if after[1] is REASONING and program not in rank.reasoning:
                rank.acting.pop(program, None)
                rank.reasoning[program] = None
                rank.reasoning_context += row.estimated_context_tokens
            elif after[1] is ACTING and program not in rank.acting:
                rank.reasoning.pop(program, None)
                rank.acting[program] = None
                rank.reasoning_context -= row.estimated_context_tokens

    def _idle_if_quiet(self, program: Program) -> bool:
        if (
            program.in_flight == 0
            and self._request_pool.waiting(program) == 0
            and program.status is not ACTING
        ):
            self._move(program, _IDLE)
            return True
        return False

    def _leave_placement(self, program: Program, rank_id: str) -> None:
        row = cast(_Row, program)
        rank = self.ranks[rank_id]
        if rank.reasoning.pop(program, _MISSING) is not _MISSING:
            rank.reasoning_context -= row.estimated_context_tokens
            rank.active_count -= 1
        elif rank.acting.pop(program, _MISSING) is not _MISSING:
            rank.active_count -= 1
        if row.pause_when_idle:  # (marked exactly while placed with the mark)
            rank.marked.pop(program, None)
        rank._leave(program)
        if rank.overflow is program:
            rank.overflow = None
        row.pause_when_idle = False
        row.placement = None
        row.placement_start_pending = False
        self._ledger.discharge(program, rank_id)

    def _attribute(self, program: Program, rank_id: str | None, *, unbind: bool = True) -> None:
        """Move ``program`` to the ``attributed`` index of ``rank_id`` (or the pool's unbound set)."""
        row = cast(_Row, program)
        old = row.last_rank
        if old is not None:
            self.ranks[old].attributed.pop(program, None)
        else:
            self._unbound.get(program.ref.model_pool, {}).pop(program, None)
        row.last_rank = rank_id
        if rank_id is not None:
            self.ranks[rank_id].attributed[program] = None
        elif unbind:
            self._unbound.setdefault(program.ref.model_pool, {})[program] = None


_MISSING: object = object()
