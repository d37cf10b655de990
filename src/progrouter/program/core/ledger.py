"""Capacity accounting: how many logical KV tokens each Rank's Active Programs hold. Accounting only.

Two sources, upstream §4.3. The *router ledger* is the sum of the private tokens charged by the Active
Programs placed on a Rank; ``ProgramTable`` charges at activation and discharges on every way out of Active,
policy re-charges when a Program's demand changes. The *backend observation* is vLLM's own KV usage,
scraped by a shell: ``begin_observation`` checkpoints each Rank's ledger delta before the scrape,
``apply_observations`` rebases the delta on the checkpoint, so capacity committed while the scrape was in
flight is kept (capacity 1000, usage 0.5, +50 after the checkpoint → 550). A fresh observation with a token
estimate wins; otherwise the ledger is used, and the ``capacity_accounting_source`` says why.

The ledger also answers each Rank's token capacity (``capacity``): the configured one, or under ``"auto"`` the
KV size the Rank's observations carry (``rank_capacity``). A changed size puts the Rank on the agenda, so
capacity repair and admission see it at once (a shrink below use is repaired like any overfull Rank).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from progrouter.program.core.rank_capacity import RankCapacities, TokenCapacitySource
from progrouter.program.formulas.accounting import (
    OBSERVATION_FRESHNESS_INTERVALS,
    CapacityAccountingSource,
    capacity_accounting_source,
    estimate_active_program_tokens,
    observation_fresh,
    rank_usage,
)
from progrouter.program.types import BackendObservation

if TYPE_CHECKING:
    from progrouter.program.core.agenda import Agenda
    from progrouter.program.core.state import Program, RankPrograms


@dataclass(frozen=True, slots=True)
class RankCheckpoint:
    """What the router believed about one Rank when a scrape began."""

    delta: int
    active_reasoning_programs: int
    active_reasoning_requests: int
    reasoning_private_tokens: int
    acting_private_tokens: int


@dataclass(frozen=True, slots=True)
class ObservationEpoch:
    """Token for one scrape: pass it back to ``apply_observations`` with what the scrape found."""

    revision: int
    started_at: float
    checkpoints: Mapping[str, RankCheckpoint]


@dataclass(slots=True)
class RankAccount:
    """One Rank's ledger and its latest backend observation."""

    ledger_tokens: int = 0
    delta: int = 0  # ledger changes since the last applied observation's checkpoint
    observation: BackendObservation | None = None
    observed_at: float | None = None
    native_used_tokens: float | None = None
    est_reasoning_tokens: float | None = None
    est_active_program_tokens: float | None = None
    checkpoint: RankCheckpoint | None = None
    reported_source: CapacityAccountingSource | None = None


class CapacityLedger:
    """Per-Rank accounts. Every change puts the Rank on the agenda so scheduling re-examines it."""

    def __init__(
        self, capacity_setting: int | Literal["auto"] | None, metrics_interval_seconds: float, agenda: Agenda
    ) -> None:
        self.capacities = RankCapacities(capacity_setting)
        self.metrics_interval_seconds = metrics_interval_seconds
        self.freshness_seconds = OBSERVATION_FRESHNESS_INTERVALS * metrics_interval_seconds
        self.accounts: dict[str, RankAccount] = {}
        self._agenda = agenda
        self._revision = 0
        self._charged: dict[Program, int] = {}  # every Active Program's charge: the ledger's own table

    def account(self, rank_id: str) -> RankAccount:
        account = self.accounts.get(rank_id)
        if account is None:
            account = self.accounts[rank_id] = RankAccount()
        return account

    def forget(self, rank_id: str) -> None:
        """Drop a removed Rank's account, observation and reported size (its Programs were discharged
        already)."""
        self.accounts.pop(rank_id, None)
        self.capacities.forget(rank_id)

    # ------------------------------------------------------------------------------------------ capacity
    def capacity(self, rank_id: str) -> int | None:
        """The Rank's token capacity in force; None: the Program-count guard alone. Every formula that
        needs C reads it here."""
        return self.capacities.of(rank_id)

    def capacity_source(self, rank_id: str) -> TokenCapacitySource:
        return self.capacities.source(rank_id)

    def report_capacity(self, rank_id: str, tokens: int) -> bool:
        """The Rank's vLLM reports a KV size; whether the capacity in force changed (the Rank then goes on
        the agenda for repair and admission). A Rank without an account (not live) is ignored."""
        if rank_id not in self.accounts or not self.capacities.report(rank_id, tokens):
            return False
        self._agenda.capacity_changed(rank_id)
        return True

    @property
    def revision(self) -> int:
        """Changes whenever the Rank set does: an observation begun under another revision is dropped."""
        return self._revision

    def rank_set_changed(self) -> None:
        self._revision += 1

    # -------------------------------------------------------------------------------------------- ledger
    def charged(self, program: Program) -> int:
        """The private tokens ``program`` holds charged on its placement (0 unless it is Active)."""
        return self._charged.get(program, 0)

    def charge(self, program: Program, rank_id: str, tokens: int) -> None:
        account = self.account(rank_id)
        account.ledger_tokens += tokens
        account.delta += tokens
        self._charged[program] = tokens
        self._agenda.capacity_changed(rank_id)

    def recharge(self, program: Program, tokens: int) -> None:
        """An Active Program's demand changed (growth at arrival, completion): move the ledger by the diff."""
        rank_id = program.placement
        if rank_id is None:
            return
        charged = self._charged
        diff = tokens - charged.get(program, 0)
        if diff:
            account = self.account(rank_id)
            account.ledger_tokens += diff
            account.delta += diff
            charged[program] = tokens
            self._agenda.capacity_changed(rank_id)

    def discharge(self, program: Program, rank_id: str) -> None:
        tokens = self._charged.pop(program, 0)
        account = self.accounts.get(rank_id)
        if account is not None:
            account.ledger_tokens -= tokens
            account.delta -= tokens
            self._agenda.capacity_changed(rank_id)

    def review_sources(
        self, rank_ids: Iterable[str], now: float
    ) -> list[tuple[str, CapacityAccountingSource | None, CapacityAccountingSource]]:
        """Each Rank whose capacity-accounting source changed since the last review: (target, previous,
        current); previous is None at a Rank's first review. Usage may now come from the other source, so
        each such Rank goes on the agenda."""
        changes = []
        for rank_id in rank_ids:
            account = self.account(rank_id)
            current = self.source(rank_id, now)
            previous = account.reported_source
            if previous != current:
                account.reported_source = current
                self._agenda.capacity_changed(rank_id)
                changes.append((rank_id, previous, current))
        return changes

    # ------------------------------------------------------------------------------------------- reading
    def observation_age(self, rank_id: str, now: float) -> float | None:
        account = self.accounts.get(rank_id)
        if account is None or account.observed_at is None:
            return None
        return max(0.0, now - account.observed_at)

    def fresh_observation(self, rank_id: str, now: float) -> BackendObservation | None:
        """The Rank's observation if it is at most three polling intervals old."""
        return self.admission_facts(rank_id, now)[0]

    def admission_facts(self, rank_id: str, now: float) -> tuple[BackendObservation | None, float]:
        """``fresh_observation`` and ``usage`` of the Rank, from one look at its account."""
        account = self.accounts.get(rank_id)
        if account is None:
            return None, 0.0
        observed_at = account.observed_at
        interval = self.metrics_interval_seconds
        fresh = observed_at is not None and observation_fresh(now - observed_at, interval)
        used = rank_usage(
            fresh=fresh,
            est_active_program_tokens=account.est_active_program_tokens,
            delta_since_checkpoint=account.delta,
            ledger_tokens=account.ledger_tokens,
        )
        return (account.observation if fresh else None), used

    def source(self, rank_id: str, now: float) -> CapacityAccountingSource:
        account = self.accounts.get(rank_id)
        has_observation = account is not None and account.observed_at is not None
        age = self.observation_age(rank_id, now)
        return capacity_accounting_source(
            has_observation=has_observation,
            fresh=age is not None and observation_fresh(age, self.metrics_interval_seconds),
            has_token_estimate=account is not None and account.est_active_program_tokens is not None,
        )

    def usage(self, rank_id: str, now: float) -> float:
        """Managed tokens in use on the Rank: a fresh backend estimate plus later deltas, else the ledger."""
        return self.admission_facts(rank_id, now)[1]

    def ledger_tokens(self, rank_id: str) -> int:
        account = self.accounts.get(rank_id)
        return 0 if account is None else account.ledger_tokens

    def charged_sum(self, programs: Iterable[Program]) -> int:
        """The charges of ``programs`` together."""
        charged = self._charged
        return sum(charged.get(p, 0) for p in programs)

    # --------------------------------------------------------------------------------------- observation
    def checkpoint(self, rank_id: str, rank: RankPrograms) -> RankCheckpoint:
        """The router's view of a Rank as a scrape begins (charged tokens = the Programs' private demand)."""
        return RankCheckpoint(
            delta=self.account(rank_id).delta,
            active_reasoning_programs=len(rank.reasoning),
            active_reasoning_requests=sum(p.in_flight for p in rank.reasoning),
            reasoning_private_tokens=self.charged_sum(rank.reasoning),
            acting_private_tokens=self.charged_sum(rank.acting),
        )

    def apply(
        self, now: float, epoch: ObservationEpoch, observations: Mapping[str, BackendObservation]
    ) -> list[str]:
        """Store each observed Rank's conversion; returns the Ranks updated. A changed revision is refused
        by the caller before this point; a Rank that is no longer tracked is skipped."""
        updated = []
        for rank_id, observation in observations.items():
            checkpoint = epoch.checkpoints.get(rank_id)
            account = self.accounts.get(rank_id)
            if checkpoint is None or account is None:
                continue
            capacity = self.capacities.of(rank_id)
            account.observation = observation
            account.observed_at = now
            account.checkpoint = checkpoint
            account.native_used_tokens = None if capacity is None else observation.kv_cache_usage * capacity
            account.est_active_program_tokens = estimate_active_program_tokens(
                observation.kv_cache_usage,
                capacity,
                observation.running,
                checkpoint.active_reasoning_programs,
                checkpoint.reasoning_private_tokens,
                checkpoint.acting_private_tokens,
            )
            account.est_reasoning_tokens = (
                None
                if account.est_active_program_tokens is None
                else account.est_active_program_tokens - checkpoint.acting_private_tokens
            )
            account.delta -= checkpoint.delta
            self._agenda.capacity_changed(rank_id)
            updated.append(rank_id)
        return updated
