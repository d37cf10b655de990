"""Rank admission: may this Paused Program take a placement on that Rank now? And committing it if so.

The plan (upstream §3.4), in order:
1. the vLLM waiting gate: with a *fresh* observation whose ``num_requests_waiting`` reaches
   ``admission_waiting_request_threshold`` the Rank takes nobody, not even a forced resume;
2. a forced resume (its force-resume deadline passed) is admitted past the count and token limits;
3. the count guard ``active + 1 ≤ max_active_programs_per_target`` (the only guard without token capacity);
4. token capacity: ``used + required ≤ C × low_watermark`` (immediate), and with the growth reserve too;
   when only the reserve fails, batch-gain admission may still admit.
Acting Programs are never reclaimed here: they hold their placement until their TTL or lifecycle ends it.

``RankView`` holds the facts every candidate of one Rank shares, so a scheduling pass computes them once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from progrouter.program.ledger import program_private_tokens
from progrouter.program.outcomes import Dispatched, ProgramDispatch
from progrouter.program.policy import (
    BatchGainEstimate,
    batch_gain_for_rank,
    growth_reserve,
    target_rounds,
)
from progrouter.program.types import BackendObservation

if TYPE_CHECKING:
    from progrouter.program.core import Core
    from progrouter.program.factors import RankFactors
    from progrouter.program.state import Program


class Rejection(StrEnum):
    WAITING_GATE = "waiting_gate"  # blocks every candidate of the Rank, forced ones too
    COUNT = "count"  # blocks every candidate that is not forced
    CAPACITY = "capacity"  # this candidate's demand does not fit; a smaller one might
    RESERVE = "reserve"  # fits now, not with the growth reserve, and batch gain does not cover it


class RankView:
    """One Rank's admission facts at one instant; the growth reserve and batch-gain inputs are computed
    only when a candidate gets that far, and at most once per view."""

    __slots__ = (
        "_batch",
        "_core",
        "_reserve",
        "active",
        "factors",
        "gate_blocked",
        "low_tokens",
        "target_id",
        "target_rounds",
        "used",
    )

    def __init__(self, core: Core, target_id: str, now: float) -> None:
        config = core.config
        self._core = core
        self.target_id = target_id
        self.factors = core.factors.get(target_id)
        threshold = config.admission_waiting_request_threshold
        observation = core.ledger.fresh_observation(target_id, now) if threshold > 0 else None
        self.gate_blocked = observation is not None and observation.waiting >= threshold
        self.active = core.table.rank(target_id).active_count
        self.used = core.ledger.usage(target_id, now)
        self.low_tokens = core.low_tokens
        self.target_rounds = target_rounds(self.factors, config.max_segment_rounds)
        self._reserve: float | None = None
        self._batch: _BatchInputs | None = None

    @property
    def count_fits(self) -> bool:
        return self.active + 1 <= self._core.config.max_active_programs_per_target

    def may_admit(self, required: int, uncached: int) -> bool:
        """Could an unforced candidate be admitted, given lower bounds of the candidates' demand and
        uncached context? False means no unforced candidate can: count, capacity, reserve and batch gain."""
        if not self.count_fits:
            return False
        low = self.low_tokens
        if low is None or self.used + required + self.reserve <= low:
            return True
        if self.used + required > low:
            return False
        return self._batch_bound_allows(uncached)

    def refuses_quickly(self, required: int, recovery_seconds: float) -> bool:
        """For an unforced candidate on a Rank whose count fits: refused for capacity, or for the reserve
        with a recovery cost the best-case batch gain cannot cover. Equal to ``plan``'s refusals."""
        low = self.low_tokens
        assert low is not None
        if self.used + required > low:
            return True
        return self.used + required + self.reserve > low and not self._batch_bound_covers(recovery_seconds)

    def _batch_bound_allows(self, uncached: int) -> bool:
        """The best case bounds every candidate: the decode gain only shrinks with context, the recovery
        grows with the uncached context and the continuity loss with demand."""
        return self._batch_bound_covers(
            self._core.config.prefill_cost_model.cache_miss_impact_seconds(uncached)
        )

    def _batch_bound_covers(self, recovery_seconds: float) -> bool:
        if self._batch is None:
            self._batch = self._batch_inputs()
        best = self._batch.best
        return best.batch_gain_seconds >= recovery_seconds + best.continuity_loss_seconds

    def batch_gain_admits(self, context_tokens: int, shared_prefix_tokens: int, required: int) -> bool:
        """Batch-gain admission of one reserve-failing candidate (upstream §3.6).

        The Rank's inputs are gathered once per view: the protected Programs enter as their total rounds
        and mean impact, which is all the formula uses of them. A best-case estimate (empty candidate) bounds
        every candidate: the gain only shrinks with context and the continuity loss only grows with demand,
        so a candidate whose recovery alone exceeds the best-case margin is refused without the full model.
        """
        if not self._batch_bound_allows(max(0, context_tokens - shared_prefix_tokens)):
            return False
        assert self._batch is not None
        return self._batch.estimate(context_tokens, shared_prefix_tokens, float(required)).admits

    def _batch_inputs(self) -> _BatchInputs:
        rank = self._core.table.rank(self.target_id)
        count, remaining, impact = rank.protected(self.target_rounds)
        protected = ([float(remaining)], [impact / count]) if count else ([], [])
        inputs = _BatchInputs(
            self._core, self.factors, len(rank.reasoning), rank.reasoning_context, self.used, protected
        )
        inputs.best = inputs.estimate(0, 0, 0.0)
        return inputs

    @property
    def reserve(self) -> float:
        """The growth reserve: room for every Active Program and the candidate to grow for their rounds."""
        if self._reserve is None:
            self._reserve = 0.0
            factors, rounds = self.factors, self.target_rounds
            if self.low_tokens is not None and rounds > 0 and factors is not None:
                self._reserve = growth_reserve(
                    factors.average_context_growth_tokens(),
                    rounds,
                    [self._core.table.rank(self.target_id).protected(rounds)[1]],
                )
        return self._reserve


class _BatchInputs:
    """The Rank's side of batch-gain admission, fixed for one view."""

    __slots__ = ("batch_size", "best", "context_tokens", "core", "factors", "protected", "used")

    def __init__(
        self,
        core: Core,
        factors: RankFactors | None,
        batch_size: int,
        context_tokens: int,
        used: float,
        protected: tuple[list[float], list[float]],
    ) -> None:
        self.core = core
        self.factors = factors
        self.batch_size = batch_size
        self.context_tokens = context_tokens
        self.used = used
        self.protected = protected
        self.best: BatchGainEstimate

    def estimate(self, context_tokens: int, shared_prefix_tokens: int, required: float) -> BatchGainEstimate:
        return batch_gain_for_rank(
            self.core.config,
            self.factors,
            batch_size_before=self.batch_size,
            context_tokens_before=self.context_tokens,
            candidate_context_tokens=context_tokens,
            candidate_shared_prefix_tokens=shared_prefix_tokens,
            used_tokens=self.used,
            required_tokens=required,
            protected_remaining_rounds=self.protected[0],
            protected_cache_miss_impacts=self.protected[1],
        )


@dataclass(frozen=True, slots=True)
class AdmissionPlan:
    target_id: str
    forced: bool
    batch_gain: bool
    active: int
    used: float
    required: int
    reserve: float


def rank_view(core: Core, target_id: str, now: float) -> RankView:
    return RankView(core, target_id, now)


def required_tokens(core: Core, program: Program) -> int:
    """The candidate's private demand, with its front request's expected output if it gave one."""
    front = core.pool.front_hints(program)
    expected = front.expected_output_tokens if front is not None else None
    return program_private_tokens(program, core.config.decode_buffer_tokens, expected)


def plan(core: Core, view: RankView, program: Program, now: float) -> AdmissionPlan | Rejection:
    if view.gate_blocked:
        return Rejection.WAITING_GATE
    deadline = program.force_resume_deadline
    forced = deadline is not None and deadline <= now
    required = program.queue_required if program.queue_key is not None else required_tokens(core, program)
    count_fits = view.count_fits

    def admit(batch_gain: bool = False) -> AdmissionPlan:
        return AdmissionPlan(
            view.target_id, forced, batch_gain, view.active, view.used, required, view.reserve
        )

    low = view.low_tokens
    if low is None:
        return admit() if forced or count_fits else Rejection.COUNT
    immediate_fits = view.used + required <= low
    if forced or (count_fits and immediate_fits and view.used + required + view.reserve <= low):
        return admit()
    if not count_fits:
        return Rejection.COUNT
    if not immediate_fits:
        return Rejection.CAPACITY
    admits = view.batch_gain_admits(program.estimated_context_tokens, program.shared_prefix_tokens, required)
    return admit(batch_gain=True) if admits else Rejection.RESERVE


def commit_admission(core: Core, program: Program, plan: AdmissionPlan, now: float) -> None:
    """Activate ``program`` on the planned Rank and dispatch its retained requests."""
    previous = program.last_target
    target = plan.target_id
    core.queues.remove(program)
    core.table.activate(program, target, plan.required)
    program.acting_since = None
    program.ttl_deadline = None
    if program.segment_started_at is None:
        program.segment_started_at = now
    program.paused_at = None
    program.last_pause_reason = None  # clears the one-shot segment-yield marker
    program.queued_at = None
    program.force_resume_deadline = None
    program.force_resume_timeout = None
    program.force_resume_active_remaining_rounds = None
    program.force_resume_pool_remaining_rounds = None
    program.force_resume_request_throughput_per_second = None
    observer = core.observer
    capacity = core.config.token_capacity_per_dp_rank
    observer.event(
        "info",
        "program_admit",
        program=program.redacted,
        target=target,
        forced=plan.forced,
        batch_gain=plan.batch_gain,
        active_programs=plan.active,
        used_tokens=plan.used,
        required_tokens=plan.required,
        reserve_tokens=plan.reserve,
        capacity_tokens=capacity,
    )
    if not core.config.binding_only:
        _admission_histograms(core, plan, now)
    reason = "force_resume" if plan.forced else "batch_gain_admit" if plan.batch_gain else "program_admit"
    observer.transition(target, reason)
    if previous is not None and previous != target:
        observer.transition(target, "cross_rank_resume")
    dispatch_retained(core, program, now)


def _admission_histograms(core: Core, plan: AdmissionPlan, now: float) -> None:
    observer = core.observer
    target = plan.target_id
    observer.histogram("admission_used_tokens", plan.used, target=target)
    observer.histogram("admission_required_tokens", plan.required, target=target)
    observer.histogram("admission_growth_reserve_tokens", plan.reserve, target=target)
    capacity = core.config.token_capacity_per_dp_rank
    if capacity is not None:
        observer.histogram("admission_capacity_pressure_ratio", plan.used / capacity, target=target)
        projected = (plan.used + plan.required + plan.reserve) / capacity
        observer.histogram("admission_projected_pressure_ratio", projected, target=target)
    account = core.ledger.accounts.get(target)
    observation: BackendObservation | None = None if account is None else account.observation
    if account is not None and observation is not None and account.observed_at is not None:
        observer.histogram("admission_backend_kv_usage_ratio", observation.kv_cache_usage, target=target)
        observer.histogram("admission_backend_running_requests", observation.running, target=target)
        observer.histogram("admission_backend_waiting_requests", observation.waiting, target=target)
        age = max(0.0, now - account.observed_at)
        observer.histogram("admission_capacity_observation_age_seconds", age, target=target)


def dispatch_retained(core: Core, program: Program, now: float) -> None:
    """Send every retained request of an Active Program to its placement, front first."""
    target_id = program.placement
    assert target_id is not None
    target = core.targets[target_id]
    pool = core.pool
    observer = core.observer
    while pool.waiting(program):
        request = pool.pop_front(program)
        first = core.table.dispatched(program)
        queued = max(0.0, now - request.arrived_at)
        dispatch = ProgramDispatch(
            handle=request.handle,
            target=target,
            program=program.ref,
            placement_epoch=program.placement_epoch,
            estimated_context_tokens=request.estimated_context_tokens,
            arrived_at=request.arrived_at,
            dispatched_at=now,
            queued_seconds=queued,
            hints=request.hints,
            placement_start_request=first,
        )
        core.outstanding[request.handle.id] = dispatch
        core.outcomes.append(Dispatched(request.handle, dispatch))
        core.binder.commit(request.routing_text, target_id)
        observer.histogram("queue_wait_seconds", queued, target=target_id)
        observer.event(
            "debug",
            "request_dispatch",
            program=program.redacted,
            program_id=program.ref.program_id,
            target=target_id,
            queued_seconds=queued,
            placement_start=first,
        )
