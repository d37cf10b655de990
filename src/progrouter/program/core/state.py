"""Program state: who exists, in which state, placed where. Every Program state change happens here.

Theory of operation. A Program is keyed by (model pool, program id) and lives as one *generation* at a time;
``ProgramRef`` names a generation, so a completion or cancellation of an older generation can never touch a
newer one. A Program is in one of four phases, the product of two fields:

    state  Active (owns logical KV capacity on its placement Rank) | Paused (no placement)
    status Reasoning (a request is in flight or retained)          | Acting (between requests: a tool call)

Rules that fence this module in:
1. Only ``ProgramTable`` changes ``state``, ``status``, ``placement``, ``placement_epoch``, ``in_flight``,
   ``last_rank`` and generations, and the indexed facts ``rounds_since_activation``,
   ``estimated_context_tokens``, ``last_cache_miss_impact_seconds`` and ``pause_when_idle`` (each Rank keeps
   sums of them for the growth reserve, batch gain and repair). That is the types' doing, not a convention:
   ``Program`` declares them as read-only properties and the table's private row class (table.py), the only
   class it builds, shadows them with writable slots. The lifecycle's facts are ``program.lifecycle``, a
   read-only ``LifecycleRecord`` (records.py) only lifecycle.py can write; identity is ``Final``.
2. The allowed phase changes are the ``TRANSITIONS`` table below; any other change raises
   ``IllegalTransition`` at once. Capacity follows placement: activating charges the ledger, every way out of
   Active (pause, invalidate, release) discharges it, so the ledger cannot drift from the states.
3. Every activation takes a fresh, scheduler-wide placement epoch; a dispatch remembers it, and a completion
   whose epoch is not the Program's current one is stale and ignored (the Rank vanished meanwhile, or the
   generation was replaced — even if a pruned generation number is reused).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from mypy_extensions import mypyc_attr

from progrouter.program.core.records import LifecycleRecord, PauseReason


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


class Program:
    """One Program generation as everyone but ``ProgramTable`` sees it: who it is, its phase and placement
    (read-only here: the table's row class, table.py, is the only writable one, and the only one built) and
    the lifecycle's record (read-only too, records.py). mypy rejects an assignment to any of them."""

    __slots__ = ("created_at", "lifecycle", "redacted", "ref", "serial")

    def __init__(
        self, ref: ProgramRef, serial: int, redacted: str, created_at: float, lifecycle: LifecycleRecord
    ) -> None:
        self.ref: Final = ref
        self.serial: Final = serial  # scheduler-wide creation order, a cheap unique tie-break
        self.redacted: Final = redacted
        self.created_at: Final = created_at
        self.lifecycle: Final = lifecycle  # the lifecycle's facts (records.LifecycleRecord)

    # --- phase and placement: the table's row provides them (each shadows its property there) ----------
    @property
    def state(self) -> ProgramState:
        raise NotImplementedError

    @property
    def status(self) -> ProgramStatus:
        raise NotImplementedError

    @property
    def placement(self) -> str | None:
        raise NotImplementedError

    @property
    def placement_epoch(self) -> int:
        raise NotImplementedError

    @property
    def placement_start_pending(self) -> bool:
        raise NotImplementedError

    @property
    def in_flight(self) -> int:
        raise NotImplementedError

    @property
    def home_rank(self) -> str | None:
        raise NotImplementedError

    @property
    def last_rank(self) -> str | None:
        raise NotImplementedError

    @property
    def rounds_since_activation(self) -> int:  # indexed per Rank (growth reserve, batch gain)
        raise NotImplementedError

    @property
    def estimated_context_tokens(self) -> int:  # indexed per Rank while Active+Reasoning
        raise NotImplementedError

    @property
    def last_cache_miss_impact_seconds(self) -> float:  # indexed per Rank while Active
        raise NotImplementedError

    @property
    def pause_when_idle(self) -> bool:  # capacity repair's mark, indexed per Rank
        raise NotImplementedError

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
    def paused_at(self) -> float | None:
        pause = self.lifecycle.pause
        return None if pause is None else pause.at

    @property
    def last_pause_reason(self) -> PauseReason | None:
        pause = self.lifecycle.pause
        return None if pause is None else pause.reason

    @property
    def completed_requests(self) -> int:
        return self.lifecycle.completions.requests


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
        self.attributed: dict[Program, None] = {}  # every live Program whose last_rank is this Rank
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
