"""Hypothesis state machine over the scheduler: random arrivals, completions, cancellations, ticks,
observations and Rank churn, with TTL expiry, repair, retention and force resume all in play.

Invariants, checked after every step:
- an admission respects the count guard and ``used + required ≤ C × low`` unless it is a forced resume;
- every request is exactly one of: retained, dispatched, cancelled, timed out;
- no queued Program is past its force-resume deadline on a Rank whose waiting gate is open;
- the ledger of every Rank equals the private tokens charged by its Active Programs, and the per-Rank
  indexes agree with each Program's state;
and at the end, after the shell completes everything and time passes: every request was resolved, every
Program was released, and every ledger is zero.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from conftest import identity
from progrouter.config import ProgramSchedulingConfig
from progrouter.program.core.request_pool import RequestHandle
from progrouter.program.core.scheduler import ProgramScheduler
from progrouter.program.core.state import ProgramState, ProgramStatus
from progrouter.program.observer import NullObserver
from progrouter.program.outcomes import Dispatched, ProgramDispatch, ProgramRequest, TimedOut
from progrouter.program.types import BackendObservation, RequestHints, UsageObservation
from progrouter.routing.target import Target

pytestmark = pytest.mark.timeout(120)

POOL = "program:model:m"
TARGETS = [Target.parse(f"http://w:1@{r}") for r in range(3)]
PROGRAMS = [f"p{i}" for i in range(6)]


class AdmissionChecker(NullObserver):
    """Checks each committed admission against the limits it must respect."""

    def __init__(self, config: ProgramSchedulingConfig) -> None:
        self.config = config
        self.violations: list[dict[str, Any]] = []
        self.forced: set[str] = set()  # redacted ids admitted by force (they may exceed the limits)

    def event(self, level: str, name: str, **fields: Any) -> None:  # type: ignore[override]
        if name != "program_admit":
            return
        if fields["forced"]:
            self.forced.add(fields["program"])
            return
        self.forced.discard(fields["program"])
        config = self.config
        if fields["active_programs"] + 1 > config.max_active_programs_per_target:
            self.violations.append(fields)
        capacity = config.token_capacity_per_dp_rank
        if (
            capacity is not None
            and fields["used_tokens"] + fields["required_tokens"]
            > capacity * config.low_watermark_ratio + 1e-6
        ):
            self.violations.append(fields)


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        capacity=st.sampled_from([None, 1500, 4000]),
        max_active=st.integers(1, 3),
        global_queue=st.booleans(),
        low=st.sampled_from([0.6, 0.8, 1.0]),
        resume_order=st.sampled_from(["mru", "fcfs"]),
        force_timeout=st.sampled_from([5.0, 12.0]),
        binding=st.sampled_from(["consistent_hash", "least_program_count", "program_round_robin"]),
    )
    def setup(
        self,
        capacity: int | None,
        max_active: int,
        global_queue: bool,
        low: float,
        resume_order: str,
        force_timeout: float,
        binding: str,
    ) -> None:
        self.config = ProgramSchedulingConfig(
            token_capacity_per_dp_rank=capacity,
            max_active_programs_per_target=max_active,
            global_queue=global_queue,
            low_watermark_ratio=low,
            high_watermark_ratio=min(1.0, low + 0.1),
            resume_order=resume_order,
            force_resume_timeout_seconds=force_timeout,
            queue_timeout_seconds=20.0,
            paused_retention_ttl_seconds=15.0,
            stats_window_size=3,
            max_segment_rounds=3,
            binding_strategy=binding,
        )
        self.checker = AdmissionChecker(self.config)
        self.scheduler = ProgramScheduler(self.config, observer=self.checker)
        self.now = 0.0
        self.live_targets = list(TARGETS)
        self.scheduler.set_ranks(POOL, self.live_targets, self.now)
        self.retained: dict[int, RequestHandle] = {}
        self.in_flight: dict[int, ProgramDispatch] = {}
        self.resolved: dict[int, str] = {}

    # ------------------------------------------------------------------------------------------ helpers
    def advance(self, dt: float) -> None:
        self.now += dt

    def collect(self) -> None:
        for outcome in self.scheduler.take_outcomes():
            hid = outcome.handle.id
            assert hid in self.retained, "an outcome for a request that was not retained"
            del self.retained[hid]
            if isinstance(outcome, Dispatched):
                self.in_flight[hid] = outcome.dispatch
                self.resolved[hid] = "dispatched"
            else:
                assert isinstance(outcome, TimedOut)
                self.resolved[hid] = "timed_out"

    # ------------------------------------------------------------------------------------------- rules
    @rule(
        program=st.sampled_from(PROGRAMS),
        context=st.integers(50, 1200),
        ttl=st.one_of(st.none(), st.floats(0.1, 6.0)),
        deadline=st.one_of(st.none(), st.floats(1.0, 25.0)),
        expected=st.one_of(st.none(), st.integers(10, 400)),
        priority=st.integers(0, 2),
        dt=st.floats(0.0, 1.5),
    )
    def arrive(
        self,
        program: str,
        context: int,
        ttl: float | None,
        deadline: float | None,
        expected: int | None,
        priority: int,
        dt: float,
    ) -> None:
        self.advance(dt)
        hints = RequestHints(
            priority=priority,
            deadline_seconds=deadline,
            expected_output_tokens=expected,
            kv_retention_ttl_seconds=ttl,
        )
        request = ProgramRequest(identity(program), hints, POOL, context)
        if not self.live_targets:
            with pytest.raises(Exception, match="no healthy DP targets"):
                self.scheduler.arrive(self.now, request)
            self.collect()  # timers due by now still ran
            return
        handle = self.scheduler.arrive(self.now, request)
        self.retained[handle.id] = handle
        self.collect()

    @precondition(lambda self: bool(self.in_flight))
    @rule(
        data=st.data(),
        success=st.booleans(),
        growth=st.integers(-200, 600),
        cached_ratio=st.one_of(st.none(), st.floats(0.0, 1.0)),
        dt=st.floats(0.0, 3.0),
    )
    def complete(
        self, data: st.DataObject, success: bool, growth: int, cached_ratio: float | None, dt: float
    ) -> None:
        self.advance(dt)
        hid = data.draw(st.sampled_from(sorted(self.in_flight)))
        dispatch = self.in_flight.pop(hid)
        prompt = max(1, dispatch.estimated_context_tokens + growth)
        cached = None if cached_ratio is None else int(prompt * cached_ratio)
        usage = UsageObservation(prompt_tokens=prompt, completion_tokens=50, cached_tokens=cached)
        self.scheduler.complete(self.now, dispatch, success=success, usage=usage, decode_seconds=0.5)
        self.collect()

    @precondition(lambda self: bool(self.retained))
    @rule(data=st.data(), dt=st.floats(0.0, 1.0))
    def cancel(self, data: st.DataObject, dt: float) -> None:
        self.advance(dt)
        hid = data.draw(st.sampled_from(sorted(self.retained)))
        self.scheduler.cancel(self.now, self.retained[hid])
        self.collect()
        if hid in self.retained:  # an outcome may have resolved it on the way (a timer due at this time)
            del self.retained[hid]
            self.resolved[hid] = "cancelled"

    @rule(dt=st.floats(0.1, 4.0))
    def tick(self, dt: float) -> None:
        self.advance(dt)
        self.scheduler.tick(self.now)
        self.collect()

    @rule(
        usage=st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3),
        waiting=st.lists(st.integers(0, 2), min_size=3, max_size=3),
        dt=st.floats(0.0, 1.0),
    )
    def observe(self, usage: list[float], waiting: list[int], dt: float) -> None:
        epoch = self.scheduler.begin_observation(self.now)
        self.advance(dt)
        observations = {
            t.id: BackendObservation(u, 1, w) for t, u, w in zip(TARGETS, usage, waiting, strict=True)
        }
        self.scheduler.apply_observations(self.now, epoch, observations)
        self.collect()

    @rule(keep=st.lists(st.booleans(), min_size=3, max_size=3), dt=st.floats(0.0, 1.0))
    def set_ranks(self, keep: list[bool], dt: float) -> None:
        self.advance(dt)
        self.live_targets = [t for t, k in zip(TARGETS, keep, strict=True) if k]
        self.scheduler.set_ranks(POOL, self.live_targets, self.now)
        self.collect()

    # -------------------------------------------------------------------------------------- invariants
    @invariant()
    def admissions_respect_limits(self) -> None:
        assert not self.checker.violations, self.checker.violations[0]

    @invariant()
    def every_request_has_exactly_one_fate(self) -> None:
        core = self.scheduler
        assert len(core.parts.request_pool) == len(self.retained)
        for handle in self.retained.values():
            assert core.parts.request_pool.retained(handle.id) is not None
        assert not set(self.retained) & set(self.resolved)

    @invariant()
    def no_program_starves_past_its_force_deadline(self) -> None:
        core = self.scheduler
        threshold = self.config.admission_waiting_request_threshold
        for program in core.parts.table:
            force = core.parts.keeper.record(program)
            deadline = None if force is None else force.deadline
            if core.parts.queues.key(program) is None or deadline is None or deadline > self.now:
                continue
            observation = core.parts.ledger.fresh_observation(program.last_rank or "", self.now)
            gated = observation is not None and observation.waiting >= threshold
            # forced resumes past the limits go one at a time per Rank: the next waits while one is there
            overflow = core.parts.table.peek_rank(program.last_rank or "").overflow is not None
            late = self.now - deadline
            assert gated or overflow, f"{program.ref} waits {late:.2f}s past its force deadline"

    @invariant()
    def forced_resumes_exceed_the_count_by_at_most_one(self) -> None:
        core = self.scheduler
        for target in TARGETS:
            active = core.parts.table.peek_rank(target.id).active_count
            assert active <= self.config.max_active_programs_per_target + 1, (target.id, active)

    @invariant()
    def ledger_and_indexes_agree_with_states(self) -> None:
        core = self.scheduler
        parts = core.parts
        charged: dict[str, int] = {}
        for program in core.parts.table:
            waiting = core.parts.request_pool.waiting(program)
            if program.state is ProgramState.ACTIVE:
                assert program.placement is not None and program.placement == program.last_rank
                charged[program.placement] = charged.get(program.placement, 0) + parts.ledger.charged(program)
                rank = core.parts.table.ranks[program.placement]
                index = rank.reasoning if program.status is ProgramStatus.REASONING else rank.acting
                assert program in index
                assert waiting == 0 and core.parts.queues.key(program) is None
            else:
                assert (
                    program.placement is None
                    and core.parts.ledger.charged(program) == 0
                    and program.in_flight == 0
                )
                queued = waiting > 0 and program.last_rank is not None
                assert (core.parts.queues.key(program) is not None) == queued
                assert (program.status is ProgramStatus.REASONING) == (waiting > 0)
        for rank_id in core.parts.fleet.targets:
            assert core.parts.ledger.ledger_tokens(rank_id) == charged.get(rank_id, 0)
            rank = core.parts.table.ranks[rank_id]
            histogram = [0] * len(rank.rounds)
            impacts = [0.0] * len(rank.rounds)
            for program in rank.active():
                bucket = min(program.rounds_since_activation, len(histogram) - 1)
                histogram[bucket] += 1
                impacts[bucket] += program.last_cache_miss_impact_seconds
            assert histogram == rank.rounds
            assert rank.impacts == pytest.approx(impacts, abs=1e-6)
            assert rank.reasoning_context == sum(p.estimated_context_tokens for p in rank.reasoning)

    # ---------------------------------------------------------------------------------------- the end
    def teardown(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        self.live_targets = list(TARGETS)
        self.scheduler.set_ranks(POOL, self.live_targets, self.now)
        self.collect()
        for _ in range(200):
            for hid in sorted(self.in_flight):
                dispatch = self.in_flight.pop(hid)
                self.scheduler.complete(self.now, dispatch, success=True, usage=None)
            self.collect()
            if not self.retained and not self.in_flight:
                break
            self.advance(1.0)
            self.scheduler.tick(self.now)
            self.collect()
        assert not self.retained and not self.in_flight
        self.advance(self.config.paused_retention_ttl_seconds + 10.0)
        self.scheduler.tick(self.now)
        self.advance(self.config.paused_retention_ttl_seconds + 10.0)
        self.scheduler.tick(self.now)
        core = self.scheduler
        assert len(core.parts.table) == 0, [
            (
                p.ref,
                p.state,
                p.status,
                p.paused_at,
                p.last_pause_reason,
                p.completed_requests,
                p.last_rank,
                self.now,
            )
            for p in core.parts.table
        ]
        for rank_id in core.parts.fleet.targets:
            assert core.parts.ledger.ledger_tokens(rank_id) == 0
            assert core.parts.table.ranks[rank_id].active_count == 0
        assert self.scheduler.diagnostics(self.now)["retained_requests"] == 0


SchedulerMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_scheduler_state_machine = SchedulerMachine.TestCase
