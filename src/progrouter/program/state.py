"""Program state: who exists, in which state, placed where. Every Program state change happens here.

Theory of operation. A Program is keyed by (model pool, program id) and lives as one *generation* at a time;
``ProgramRef`` names a generation, so a completion or cancellation of an older generation can never touch a
newer one. A Program is in one of four phases, the product of two fields:

    state  Active (owns logical KV capacity on its placement Rank) | Paused (no placement)
    status Reasoning (a request is in flight or retained)          | Acting (between requests: a tool call)

Rules that fence this module in:
1. Only ``ProgramTable`` changes ``state``, ``status``, ``placement``, ``placement_epoch``, ``in_flight``,
   ``last_target`` and generations, and the indexed facts ``rounds_since_activation``,
   ``estimated_context_tokens``, ``last_cache_miss_impact_seconds`` and ``pause_when_idle`` (each Rank keeps
   sums of them for the growth reserve, batch gain and repair). Every other field has one owner module
   (``FIELD_OWNERS``) that replaces it whole — the decision records of records.py — and a test fails on any
   write from elsewhere.
2. The allowed phase changes are the ``TRANSITIONS`` table below; any other change raises
   ``IllegalTransition`` at once. Capacity follows placement: activating charges the ledger, every way out of
   Active (pause, invalidate, release) discharges it, so the ledger cannot drift from the states.
3. Every activation takes a fresh, scheduler-wide placement epoch; a dispatch remembers it, and a completion
   whose epoch is not the Program's current one is stale and ignored (the Rank vanished meanwhile, or the
   generation was replaced — even if a pruned generation number is reused).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from mypy_extensions import mypyc_attr

from progrouter.program.records import (
    NO_COMPLETIONS,
    NO_SEGMENT,
    NO_SHARED_PREFIX,
    ActingTTL,
    Completions,
    ForceResume,
    Pause,
    PauseReason,
    QueueEntry,
    QueueKey,
    Segment,
    SharedPrefix,
)
from progrouter.program.types import ProgramIdentity, RequestHints

if TYPE_CHECKING:
    from progrouter.program.ledger import CapacityLedger
    from progrouter.program.pool import RequestPool


class ProgramState(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"


class ProgramStatus(StrEnum):
    REASONING = "reasoning"
    ACTING = "acting"


class Event(StrEnum):
    RETAIN = "retain"  # a request arrived for the Program
    ACTIVATE = "activate"  # admission committed a placement
    IDLE = "idle"  # nothing in flight and nothing retained any more
    PAUSE = "pause"  # an idle Active Program gives its placement up
    INVALIDATE = "invalidate"  # the placement Rank vanished
    RELEASE = "release"  # the generation ends


#: The members as plain globals: CPython 3.11 reads ``ProgramState.ACTIVE`` through the enum metaclass's
#: ``__getattr__``, several times what a global costs, and the hot paths here read them on every event.
ACTIVE, PAUSED = ProgramState.ACTIVE, ProgramState.PAUSED
REASONING, ACTING = ProgramStatus.REASONING, ProgramStatus.ACTING
_RETAIN, _ACTIVATE, _IDLE, _PAUSE = Event.RETAIN, Event.ACTIVATE, Event.IDLE, Event.PAUSE

Phase = tuple[ProgramState, ProgramStatus]
AR: Phase = (ACTIVE, REASONING)
AA: Phase = (ACTIVE, ACTING)
PR: Phase = (PAUSED, REASONING)
PA: Phase = (PAUSED, ACTING)

#: event -> {phase before: phase after}; RELEASE maps to None (the generation is gone).
TRANSITIONS: dict[Event, dict[Phase, Phase | None]] = {
    Event.RETAIN: {PA: PR, PR: PR, AA: AR, AR: AR},
    Event.ACTIVATE: {PR: AR},
    Event.IDLE: {AR: AA, PR: PA},
    Event.PAUSE: {AA: PA},
    Event.INVALIDATE: {AR: PR, AA: PA},
    Event.RELEASE: {PA: None, AA: None},
}


@mypyc_attr(native_class=False)  # compiled, an exception subclass must stay a plain class
class IllegalTransition(RuntimeError):
    """A Program state change the table does not allow: a scheduler bug, never a client error."""


@dataclass(frozen=True, slots=True)
class ProgramRef:
    """One generation of a Program. Raw ids go to DEBUG logs only; everything else uses ``redacted_id``."""

    model_pool: str
    program_id: str
    generation: int

    def redacted_id(self) -> str:
        """16 hex digits of a stable hash of the whole ref (stable across processes, unlike ``hash``)."""
        raw = f"{self.model_pool}\x00{self.program_id}\x00{self.generation}".encode("utf-8", "surrogatepass")
        return hashlib.blake2b(raw, digest_size=8).hexdigest()


#: Who may assign each ``Program`` field (a module of this package); everyone else reads. The fields owned
#: here are the phase, the placement and the facts the per-Rank indexes sum; the rest are records
#: (records.py) or single facts replaced whole by their owner. tests/program/test_fence.py enforces it.
FIELD_OWNERS: dict[str, str] = {
    **dict.fromkeys(
        (
            "state",
            "status",
            "placement",
            "placement_epoch",
            "placement_start_pending",
            "in_flight",
            "home_target",
            "last_target",
            "rounds_since_activation",
            "estimated_context_tokens",
            "last_cache_miss_impact_seconds",
            "pause_when_idle",
        ),
        "state",
    ),
    "charged_tokens": "ledger",
    "queue_entry": "queues",
    "force_resume": "resume",
    **dict.fromkeys(
        (
            "identity",
            "step_id",
            "last_hints",
            "output_token_reservation",
            "context_shrink_observations",
            "acting_ttl",
            "pause",
            "segment",
            "shared_prefix",
            "completions",
        ),
        "lifecycle",
    ),
    "timer_due": "timers",
}


@dataclass(eq=False, slots=True)
class Program:
    """One Program generation: its phase and placement (owned here) and the decision records policy
    modules replace whole (``FIELD_OWNERS`` says who writes which)."""

    ref: ProgramRef
    identity: ProgramIdentity
    serial: int  # scheduler-wide creation order, a cheap unique tie-break
    redacted: str
    created_at: float
    # --- phase and placement (ProgramTable) ----------------------------------------------------------
    state: ProgramState = ProgramState.PAUSED
    status: ProgramStatus = ProgramStatus.REASONING
    placement: str | None = None
    placement_epoch: int = 0
    placement_start_pending: bool = False
    in_flight: int = 0
    home_target: str | None = None
    last_target: str | None = None
    rounds_since_activation: int = 0  # indexed per Rank (growth reserve, batch gain)
    estimated_context_tokens: int = 0  # indexed per Rank while Active+Reasoning
    last_cache_miss_impact_seconds: float = 0.0  # indexed per Rank while Active
    pause_when_idle: bool = False  # capacity repair's mark, indexed per Rank
    # --- ledger ---------------------------------------------------------------------------------------
    charged_tokens: int = 0
    # --- resume ---------------------------------------------------------------------------------------
    queue_entry: QueueEntry | None = None
    force_resume: ForceResume | None = None
    # --- lifecycle ------------------------------------------------------------------------------------
    step_id: int = 0
    last_hints: RequestHints = field(default_factory=RequestHints)
    output_token_reservation: int | None = None
    context_shrink_observations: int = 0
    acting_ttl: ActingTTL | None = None
    pause: Pause | None = None
    segment: Segment = NO_SEGMENT
    shared_prefix: SharedPrefix = NO_SHARED_PREFIX
    completions: Completions = NO_COMPLETIONS
    # --- timers ---------------------------------------------------------------------------------------
    timer_due: dict[int, float] = field(default_factory=dict)  # TimerKind -> its one pending entry

    @property
    def phase(self) -> Phase:
        return (self.state, self.status)

    @property
    def key(self) -> tuple[str, str]:
        return (self.ref.model_pool, self.ref.program_id)

    @property
    def active(self) -> bool:
        return self.state is ACTIVE

    @property
    def acting(self) -> bool:
        return self.status is ACTING

    @property
    def queue_key(self) -> QueueKey | None:
        entry = self.queue_entry
        return None if entry is None else entry.key

    @property
    def force_resume_deadline(self) -> float | None:
        force = self.force_resume
        return None if force is None else force.deadline

    @property
    def paused_at(self) -> float | None:
        pause = self.pause
        return None if pause is None else pause.at

    @property
    def last_pause_reason(self) -> PauseReason | None:
        pause = self.pause
        return None if pause is None else pause.reason

    @property
    def completed_requests(self) -> int:
        return self.completions.requests


class RankPrograms:
    """Per-Rank indexes kept in step with every transition, so nothing scans all Programs per event."""

    __slots__ = (
        "_top",
        "acting",
        "active_count",
        "attributed",
        "impacts",
        "marked",
        "overflow",
        "reasoning",
        "reasoning_context",
        "rounds",
    )

    def __init__(self, max_rounds: int) -> None:
        self.reasoning: dict[Program, None] = {}  # Active+Reasoning placed here
        self.acting: dict[Program, None] = {}  # Active+Acting placed here
        self.active_count = 0  # len(reasoning) + len(acting), read on every scheduling pass
        self.marked: dict[Program, None] = {}  # Active Programs marked pause_when_idle (capacity repair)
        self.attributed: dict[Program, None] = {}  # every live Program whose last_target is this Rank
        # Active Programs by rounds_since_activation (the last bucket holds max_rounds and above), and the
        # sum of their last cache-miss impacts per bucket: the growth reserve and batch gain read these.
        self.rounds = [0] * (max_rounds + 1)
        self.impacts = [0.0] * (max_rounds + 1)
        self._top = max_rounds  # the last bucket
        self.reasoning_context = 0  # Σ estimated context of the Active+Reasoning Programs
        # The one Program a forced resume admitted past this Rank's limits; the next waits until it leaves.
        self.overflow: Program | None = None

    def _enter(self, program: Program) -> None:
        b, top = program.rounds_since_activation, self._top
        if b > top:
            b = top
        self.rounds[b] += 1
        self.impacts[b] += program.last_cache_miss_impact_seconds

    def _leave(self, program: Program) -> None:
        b, top = program.rounds_since_activation, self._top
        if b > top:
            b = top
        rounds = self.rounds
        rounds[b] -= 1
        self.impacts[b] = self.impacts[b] - program.last_cache_miss_impact_seconds if rounds[b] else 0.0

    def protected(self, target_rounds: int) -> tuple[int, int, float]:
        """Over Active Programs with rounds left (rounds_since_activation < target_rounds): their count, the
        sum of their remaining rounds and the sum of their cache-miss impacts. O(target_rounds)."""
        count, remaining, impact = 0, 0, 0.0
        for r in range(min(target_rounds, self._top)):
            n = self.rounds[r]
            if n:
                count += n
                remaining += (target_rounds - r) * n
                impact += self.impacts[r]
        return count, remaining, impact

    def active(self) -> Iterator[Program]:
        yield from self.reasoning
        yield from self.acting


@mypyc_attr(native_class=False)  # compiled, a dict subclass must stay a plain class
class _Ranks(dict[str, RankPrograms]):
    """Rank indexes by target id, each made on first use (a hit costs one dict lookup, no call)."""

    __slots__ = ("_max_rounds",)

    def __init__(self, max_rounds: int) -> None:
        super().__init__()
        self._max_rounds = max_rounds

    def __missing__(self, target_id: str) -> RankPrograms:
        ranks = self[target_id] = RankPrograms(self._max_rounds)
        return ranks


class ProgramTable:
    """The Programs of every model pool, their generations and per-Rank indexes."""

    def __init__(self, ledger: CapacityLedger, pool: RequestPool, max_rounds: int, fence_size: int) -> None:
        self._ledger = ledger
        self._pool = pool
        self._max_rounds = max_rounds
        self._programs: dict[tuple[str, str], Program] = {}
        # The last generation of the ``fence_size`` most recently released Programs, oldest first: a
        # returning id continues its numbering; older ones start again at 0 (epochs keep completions safe).
        self._fence_size = fence_size
        self._released: dict[tuple[str, str], int] = {}
        self.ranks = _Ranks(max_rounds)  # target id -> its indexes, made on first use: read-only outside
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

    def peek_rank(self, target_id: str) -> RankPrograms:
        """A Rank's indexes for reading only: an unknown Rank reads as empty and stays unknown."""
        ranks = self.ranks.get(target_id)
        return ranks if ranks is not None else RankPrograms(self._max_rounds)

    def unbound(self, model_pool: str) -> list[Program]:
        return list(self._unbound.get(model_pool, ()))

    def forget_rank(self, target_id: str) -> None:
        """Drop the indexes of a Rank that left every pool (its Programs were moved already)."""
        ranks = self.ranks.get(target_id)
        if ranks is not None and not ranks.attributed and not ranks.active_count:
            del self.ranks[target_id]

    # ---------------------------------------------------------------------------------------- lifecycle
    def materialize(
        self, now: float, model_pool: str, identity: ProgramIdentity, home: str | None
    ) -> Program:
        """A new generation, Paused+Reasoning, bound to ``home`` (None when the pool has no Rank)."""
        key = (model_pool, identity.program_id)
        if key in self._programs:
            raise IllegalTransition(f"a generation of {key!r} is live already")
        previous = self._released.pop(key, None)
        generation = 0 if previous is None else previous + 1
        ref = ProgramRef(model_pool, identity.program_id, generation)
        program = Program(ref, identity, next(self._serials), ref.redacted_id(), now)
        program.home_target = home
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

    def activate(self, program: Program, target_id: str, tokens: int, *, overflow: bool = False) -> None:
        """Paused+Reasoning → Active+Reasoning on ``target_id``, charging ``tokens`` of logical capacity;
        ``overflow``: a forced resume past the Rank's limits (at most one per Rank at a time)."""
        self._move(program, _ACTIVATE)
        program.placement = target_id
        program.placement_epoch = next(self._epochs)
        program.placement_start_pending = True
        program.rounds_since_activation = 0
        self._attribute(program, target_id)
        rank = self.ranks[target_id]
        rank.reasoning[program] = None
        rank.active_count += 1
        rank.reasoning_context += program.estimated_context_tokens
        rank._enter(program)
        if overflow:
            rank.overflow = program
        self._ledger.charge(program, target_id, tokens)

    def count_completion(self, program: Program, seconds: float, *, round_served: bool) -> None:
        """A successful completion: one more continuous round since activation if ``round_served``, and
        ``seconds``, its cache-miss impact. The Rank's round histogram moves once, with the same float
        operations in the same order as leaving and entering it for each fact in turn (so its sums are
        bit for bit what two moves give)."""
        old = program.last_cache_miss_impact_seconds
        rounds_since = program.rounds_since_activation
        program.last_cache_miss_impact_seconds = seconds
        if round_served:
            program.rounds_since_activation = rounds_since + 1
        target = program.placement
        if target is None:
            return
        rank = self.ranks[target]
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
        if program.placement is not None and program.status is REASONING:
            self.ranks[program.placement].reasoning_context += tokens - program.estimated_context_tokens
        program.estimated_context_tokens = tokens

    def dispatched(self, program: Program) -> bool:
        """A request of an Active Program starts; returns whether it is the first of its placement."""
        if program.state is not ACTIVE:
            raise IllegalTransition(f"dispatch of a {program.state} Program")
        program.in_flight += 1
        first = program.placement_start_pending
        program.placement_start_pending = False
        return first

    def request_finished(self, program: Program) -> bool:
        """A dispatched request ended; returns whether the Program became idle (→ Acting)."""
        if program.in_flight <= 0:
            raise IllegalTransition("completion with nothing in flight")
        program.in_flight -= 1
        return self._idle_if_quiet(program)

    def request_withdrawn(self, program: Program) -> bool:
        """A retained request left the pool unserved (cancel, timeout); returns whether the Program idled."""
        return self._idle_if_quiet(program)

    def pause(self, program: Program) -> str:
        """Active+Acting → Paused+Acting; returns the Rank it left."""
        target = program.placement
        assert target is not None
        self._move(program, _PAUSE)
        self._leave_placement(program, target)
        return target

    def invalidate(self, program: Program) -> str | None:
        """The placement Rank vanished: → Paused; in-flight requests are forgotten (completions stale)."""
        target = program.placement
        if target is None:
            return None
        self._move(program, Event.INVALIDATE)
        self._leave_placement(program, target)
        program.in_flight = 0
        program.placement_epoch = next(self._epochs)
        self._idle_if_quiet(program)
        return target

    def release(self, program: Program) -> None:
        """End the generation (idle only). An Active Program gives its capacity back first."""
        if program.in_flight or self._pool.waiting(program):
            raise IllegalTransition("release of a Program with requests in flight or retained")
        target = program.placement
        self._move(program, Event.RELEASE)
        if target is not None:
            self._leave_placement(program, target)
        self._attribute(program, None, unbind=False)
        key = program.key
        del self._programs[key]
        self._released[key] = program.ref.generation
        if len(self._released) > self._fence_size:
            del self._released[next(iter(self._released))]

    def rebind(self, program: Program, target_id: str | None) -> None:
        """A Paused Program's home and last Rank become ``target_id`` (failover, or its pool came back)."""
        if program.active:
            raise IllegalTransition("rebind of an Active Program")
        program.home_target = target_id
        self._attribute(program, target_id)

    def set_marked(self, program: Program, marked: bool) -> None:
        """Capacity repair's deferred pause mark, indexed per Rank for the repair and segment-yield sums."""
        program.pause_when_idle = marked
        if program.placement is None:
            return
        rank = self.ranks[program.placement]
        if marked:
            rank.marked[program] = None
        else:
            rank.marked.pop(program, None)

    # ------------------------------------------------------------------------------------------ helpers
    def _move(self, program: Program, event: Event) -> None:
        before_state, before_status = program.state, program.status
        row, before = TRANSITIONS[event], (before_state, before_status)
        if before not in row:  # (not a sentinel compared by identity: compiled, a tuple is a new object)
            raise IllegalTransition(f"{event} is not allowed from {before_state}+{before_status}")
        after = row[before]
        if after is None:
            return
        program.state, program.status = after
        if after[1] is before_status or before_state is not ACTIVE:
            return  # the Rank's Active indexes only change when an Active Program changes status
        target = program.placement
        if target is not None and after[0] is ACTIVE:
            rank = self.ranks[target]
            if after[1] is REASONING and program not in rank.reasoning:
                rank.acting.pop(program, None)
                rank.reasoning[program] = None
                rank.reasoning_context += program.estimated_context_tokens
            elif after[1] is ACTING and program not in rank.acting:
                rank.reasoning.pop(program, None)
                rank.acting[program] = None
                rank.reasoning_context -= program.estimated_context_tokens

    def _idle_if_quiet(self, program: Program) -> bool:
        if program.in_flight == 0 and self._pool.waiting(program) == 0 and program.status is not ACTING:
            self._move(program, _IDLE)
            return True
        return False

    def _leave_placement(self, program: Program, target: str) -> None:
        rank = self.ranks[target]
        if rank.reasoning.pop(program, _MISSING) is not _MISSING:
            rank.reasoning_context -= program.estimated_context_tokens
            rank.active_count -= 1
        elif rank.acting.pop(program, _MISSING) is not _MISSING:
            rank.active_count -= 1
        if program.pause_when_idle:  # (marked exactly while placed with the mark)
            rank.marked.pop(program, None)
        rank._leave(program)
        if rank.overflow is program:
            rank.overflow = None
        program.pause_when_idle = False
        program.placement = None
        program.placement_start_pending = False
        self._ledger.discharge(program, target)

    def _attribute(self, program: Program, target_id: str | None, *, unbind: bool = True) -> None:
        """Move ``program`` to the ``attributed`` index of ``target_id`` (or the pool's unbound set)."""
        old = program.last_target
        if old is not None:
            self.ranks[old].attributed.pop(program, None)
        else:
            self._unbound.get(program.ref.model_pool, {}).pop(program, None)
        program.last_target = target_id
        if target_id is not None:
            self.ranks[target_id].attributed[program] = None
        elif unbind:
            self._unbound.setdefault(program.ref.model_pool, {})[program] = None


_MISSING: object = object()
