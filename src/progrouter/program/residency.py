"""Program scheduling on exact residency (``residency_aware``): what each Rank really holds, as decisions.

The shell reads each Rank's vLLM KV events into a residency index and reports, per Program, how many
leading tokens of its last prompt each Rank holds (``ResidencyFacts``): at arrival
(``ProgramRequest.residency``) and every observation interval
(``ProgramScheduler.observe_residency``). Ranks whose events are unknown (no source, silent, never heard)
are absent, and then the old behaviour holds. The rules:

- **held in vain**: an Acting Program keeps its tokens charged for its TTL so that its KV survives the tool
  call; once its Rank (a metrics interval or more after its last request finished, so that the events of
  what that request stored have arrived) holds less of its last prompt than a continuous cache hit needs
  (90 %, as ``cache_continuous`` counts it), the KV did not survive and the charge protects little,
  so the TTL ends now (a pause, ``ttl_expired``) and the capacity goes to waiters;
- **stays home**: a waiting Program whose Rank still holds more of its prompt than any other Rank and than
  its shared prefix (its TTL expired, its KV did not) resumes cheaply there, so the cross-Rank pass does not
  move it unless it is forced or has waited as long as recomputing it elsewhere would take;
- **prefer the holder**: a cross-Rank move goes to the Rank holding the longest prefix of its prompt, and a
  new Program binds to the Rank holding (nearly) all of it. What every Rank holds (a system prompt all share)
  is no reason to prefer one: a tie at the top leaves the choice to the usual order (binding strategy,
  cross-Rank ranking); nor is a part of it one Rank holds (the same system prompt, held by one Rank first).

Functions here only read; ``ResidencyRules`` decides, and its ``ResidencyBook`` is the one owner of the facts,
which it drops with each report.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from progrouter.program.core.state import ProgramState, ProgramStatus
from progrouter.program.formulas.growth import CACHE_CONTINUITY_RATIO

if TYPE_CHECKING:
    from progrouter.config import ProgramSchedulingConfig
    from progrouter.program.core.fleet import Fleet
    from progrouter.program.core.lifecycle import Lifecycle
    from progrouter.program.core.state import Program
    from progrouter.program.core.table import ProgramTable
    from progrouter.program.core.telemetry import Telemetry
    from progrouter.program.outcomes import ProgramRequest


Report = tuple[int, Mapping[str, int]]  # (full-block tokens of the last prompt, resident tokens per Rank)


@dataclass(frozen=True, slots=True)
class ResidencyFacts:
    """Leading tokens of a Program's last prompt held per Rank (rank id), known Ranks only, and how many of
    its tokens are in full blocks (what any Rank could hold at most; 0 when not reported)."""

    resident_tokens: Mapping[str, int]
    observed_at: float
    covered_tokens: int = 0


class ResidencyBook:
    """The latest facts per Program. A report replaces them all, so released Programs drop out with it."""

    __slots__ = ("_facts",)

    def __init__(self) -> None:
        self._facts: dict[Program, ResidencyFacts] = {}

    def get(self, program: Program) -> ResidencyFacts | None:
        return self._facts.get(program)

    def record(self, program: Program, facts: ResidencyFacts) -> None:
        self._facts[program] = facts

    def replace(self, facts: dict[Program, ResidencyFacts]) -> None:
        self._facts = facts


def resident_on(facts: ResidencyFacts | None, rank_id: str | None) -> int | None:
    """Tokens of the prompt the Rank holds; None when the Rank (or the Program) is unknown."""
    if facts is None or rank_id is None:
        return None
    return facts.resident_tokens.get(rank_id)


def held_in_vain(program: Program, facts: ResidencyFacts | None, settle: float) -> bool:
    """An Acting Program's TTL protects little: its Rank, observed at least ``settle`` seconds after its last
    request finished (time for the events of the blocks that request stored to reach the router: a report
    sooner could miss them), holds less of its last prompt than a continuous cache hit needs."""
    if program.phase != (ProgramState.ACTIVE, ProgramStatus.ACTING) or program.lifecycle.acting_ttl is None:
        return False
    held = resident_on(facts, program.placement)
    finished = program.lifecycle.completions.last_finished_at
    if held is None or facts is None or finished is None or facts.observed_at < finished + settle:
        return False
    return held < CACHE_CONTINUITY_RATIO * facts.covered_tokens


def stays_home(program: Program, facts: ResidencyFacts | None, rank_ids: Iterable[str]) -> bool:
    """Its last Rank holds more of its prompt than its shared prefix and than any other of ``rank_ids``:
    resuming there costs less prefill than anywhere else."""
    home = program.last_rank
    return home is not None and holder(facts, rank_ids, floor=program.lifecycle.shared_prefix.tokens) == home


def holder(facts: ResidencyFacts | None, rank_ids: Iterable[str], floor: int = 0) -> str | None:
    """The one Rank among ``rank_ids`` holding most of the prompt, more than ``floor`` tokens and more than
    every other; None if none does or several tie at the top."""
    if facts is None:
        return None
    best: str | None = None
    top = runner_up = floor
    for rank_id in rank_ids:
        held = facts.resident_tokens.get(rank_id, 0)
        if held > top:
            best, top, runner_up = rank_id, held, top
        elif held > runner_up:
            runner_up = held
    return best if top > runner_up else None


class ResidencyRules:
    """The rules as decisions (``residency_aware``; the scheduler builds none when it is off): the facts per
    Program (``ResidencyBook``, this component's own), replaced by each report."""

    __slots__ = ("_book", "_fleet", "_lifecycle", "_settle", "_table", "_telemetry")

    def __init__(
        self,
        config: ProgramSchedulingConfig,
        telemetry: Telemetry,
        table: ProgramTable,
        fleet: Fleet,
        lifecycle: Lifecycle,
    ) -> None:
        self._settle = config.metrics_interval_seconds
        self._telemetry = telemetry
        self._table = table
        self._fleet = fleet
        self._lifecycle = lifecycle
        self._book = ResidencyBook()

    def _fired(self, rule: str) -> None:
        """A rule changed a decision: ``residency_rule_total{rule}`` (ttl_end, stay_home, holder_bind)."""
        self._telemetry.observer.counter("residency_rule_total", rule=rule)

    def apply_report(self, reports: Mapping[tuple[str, str], Report], now: float) -> None:
        """A periodic report, per (model pool, Program id): its prompt's full-block tokens and what each
        known Rank holds of them. It replaces every Program's facts, and an Acting Program held in vain
        pauses now (``ttl_expired``: its KV is already gone)."""
        book: dict[Program, ResidencyFacts] = {}
        for (model_pool, program_id), (covered, tokens) in reports.items():
            program = self._table.get(model_pool, program_id)
            if program is not None:
                book[program] = ResidencyFacts(tokens, now, covered)
        self._book.replace(book)
        for program in self.in_vain(book):
            self._fired("ttl_end")
            rank_id = program.placement
            self._telemetry.observer.event(
                "info", "residency_ttl_end", program=program.redacted, target=rank_id
            )
            self._lifecycle.expire_ttl(program, now)

    def on_arrival(self, program: Program, request: ProgramRequest, now: float) -> None:
        """The request's own residency report is the Program's freshest."""
        if request.residency is not None:
            covered, tokens = request.residency
            self._book.record(program, ResidencyFacts(tokens, now, covered))

    def initial_home(self, request: ProgramRequest) -> str | None:
        """A new Program's first Rank: the one holding its prompt as a continuous cache hit would (90 % of
        it: a fork of a resident Program, a conversation going on under a new id), if one Rank of its pool
        does. Less is no reason: a system prompt one Rank happens to hold first would draw every new
        Program there."""
        if request.residency is None or not request.residency[0]:
            return None
        covered, tokens = request.residency
        floor = math.ceil(CACHE_CONTINUITY_RATIO * covered) - 1
        rank_ids = self._fleet.pool_ranks.get(request.model_pool, ())
        home = holder(ResidencyFacts(tokens, 0.0, covered), rank_ids, floor)
        if home is not None:
            self._fired("holder_bind")
        return home

    def keeps_source(self, program: Program, waited_seconds: float) -> bool:
        """The cross-Rank pass leaves an unforced Program whose prefix its Rank still holds, while it has
        waited less than recomputing that prefix elsewhere costs (its cache-miss impact): past that, waiting
        costs more."""
        if waited_seconds >= program.last_cache_miss_impact_seconds:
            return False
        rank_ids = self._fleet.pool_ranks.get(program.ref.model_pool, ())
        kept = stays_home(program, self._book.get(program), rank_ids)
        if kept:
            self._fired("stay_home")
        return kept

    def destination_order(self, program: Program, destination: str) -> int:
        """Sort key of a cross-Rank destination: the more of the prompt it holds, the earlier."""
        return -(resident_on(self._book.get(program), destination) or 0)

    def in_vain(self, programs: Iterable[Program]) -> list[Program]:
        """The Acting Programs whose TTL charge protects nothing any more (``held_in_vain``, one observation
        interval after their last request finished), in id order."""
        book, settle = self._book, self._settle
        return sorted((p for p in programs if held_in_vain(p, book.get(p), settle)), key=lambda p: p.serial)

    def diagnostic(self, program: Program) -> int | None:
        """Resident tokens on the Program's Rank (placement, else last), for diagnostics; None when
        unknown."""
        return resident_on(self._book.get(program), program.placement or program.last_rank)
