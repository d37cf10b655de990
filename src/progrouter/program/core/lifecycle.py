"""What happens to a Program after admission: completion, Progress-TTL, pauses, repair and release.

``Lifecycle`` does all of it but capacity repair (``CapacityRepair``, which pauses through it); it owns the
idle Paused Programs (``paused_idle``), oldest first.

- Completion (upstream §3.10): usage becomes rolling samples and segment bookkeeping; an idle Program then
  either terminates, pauses (failed request, or marked by capacity repair) or arms its acting TTL — the
  request's ``kv_retention_ttl_seconds`` if given, else the one its ``acting_ttl.TTLPolicy`` gives (the
  spec's: fitted to the Rank's continuity window, 0 until that window is complete, which pauses at once).
- TTL expiry pauses an idle Active+Acting Program (``ttl_expired``) and records its segment rounds.
- Segment yield (§3.11): a Program that served ``max_segment_rounds`` continuous rounds yields to a waiter of
  its Rank that future relief does not already cover; it resumes with a one-shot lower rank.
- Capacity repair (§3.12): above the high watermark, idle Acting Programs pause and Reasoning ones are marked
  to pause at their idle boundary, by score, until the projection is back under the low watermark.
- Paused retention (§3.14) releases idle Paused Programs; every release keeps the generation counter for a
  while so late completions stay fenced.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from progrouter.program.core.demand import program_private_tokens, required_tokens
from progrouter.program.core.factors import ContinuitySample, RequestSample
from progrouter.program.core.rank_capacity import watermark_tokens
from progrouter.program.core.records import (
    NO_COMPLETIONS,
    NO_SEGMENT,
    NO_SHARED_PREFIX,
    ActingTTL,
    Completions,
    LifecycleRecord,
    Pause,
    PauseReason,
    Segment,
    SharedPrefix,
)
from progrouter.program.core.state import AA, ACTIVE, PA, ProgramState, ProgramStatus
from progrouter.program.core.timers import ACTING_TTL, PAUSED_RETENTION
from progrouter.program.formulas.freshness import shared_prefix_freshness_seconds
from progrouter.program.formulas.growth import cache_continuous, context_growth
from progrouter.program.formulas.repair import (
    RepairVictim,
    plan_capacity_repair,
    projected_usage,
    repair_average_completion,
    repair_score,
)
from progrouter.program.formulas.ttl_fit import completion_cache_miss_impact
from progrouter.program.types import ProgramIdentity, RequestHints, UsageObservation

#: enum members read on every completion, as plain globals (why: ``state.ACTIVE``)
_TTL_EXPIRED = PauseReason.TTL_EXPIRED
_NO_HINTS = RequestHints()

if TYPE_CHECKING:
    from progrouter.config import ProgramSchedulingConfig
    from progrouter.program.core.agenda import Agenda
    from progrouter.program.core.factors import RankFactors, RankStats
    from progrouter.program.core.fleet import Fleet
    from progrouter.program.core.force_resume import ForceResumeKeeper
    from progrouter.program.core.ledger import CapacityLedger
    from progrouter.program.core.lineage import ProgramLineage
    from progrouter.program.core.queues import RankQueues
    from progrouter.program.core.request_pool import RequestPool
    from progrouter.program.core.state import Program, RankPrograms
    from progrouter.program.core.table import ProgramTable
    from progrouter.program.core.telemetry import Telemetry
    from progrouter.program.core.timers import Timers
    from progrouter.program.outcomes import ProgramDispatch, ProgramRequest
    from progrouter.program.variants.acting_ttl import TTLPolicy


class _Record(LifecycleRecord):
    """The writable ``LifecycleRecord``: made by ``Lifecycle.new_record`` and written only here, each writer
    casting ``program.lifecycle`` back to it (everyone else reads it as the read-only ``LifecycleRecord``)."""

    __slots__ = (
        "acting_ttl",
        "completions",
        "context_shrink_observations",
        "identity",
        "last_hints",
        "output_token_reservation",
        "pause",
        "segment",
        "shared_prefix",
        "step_id",
    )

    def __init__(self, identity: ProgramIdentity, step_id: int, pause: Pause) -> None:
        self.identity: ProgramIdentity = identity
        self.step_id: int = step_id
        self.last_hints: RequestHints = _NO_HINTS
        self.output_token_reservation: int | None = None
        self.context_shrink_observations: int = 0
        self.acting_ttl: ActingTTL | None = None
        self.pause: Pause | None = pause
        self.segment: Segment = NO_SEGMENT
        self.shared_prefix: SharedPrefix = NO_SHARED_PREFIX
        self.completions: Completions = NO_COMPLETIONS


# ------------------------------------------------------------------------------- records without a component
def activated(program: Program, now: float) -> None:
    """Admission placed the Program: no TTL, no pause (the segment-yield marker goes), a segment starts."""
    record = cast(_Record, program.lifecycle)
    record.acting_ttl = None
    record.pause = None
    segment = record.segment
    if segment.started_at is None:
        record.segment = Segment(now, *segment[1:])


def rebound(program: Program, now: float) -> None:
    """A Paused Program got a new home: its segment ends and the next one observes the shared prefix
    afresh; it counts as paused from now (keeping why it paused)."""
    record = cast(_Record, program.lifecycle)
    reason = None if record.pause is None else record.pause.reason
    record.pause = Pause(now, reason)
    record.acting_ttl = None
    record.segment = Segment(None, *record.segment[1:])
    shared = record.shared_prefix
    record.shared_prefix = SharedPrefix(shared.tokens, False, shared.anchor_at, shared.fresh_until)


def observe_context(table: ProgramTable, program: Program, prompt_tokens: int) -> None:
    """Growth applies at once; a shrink only after two consecutive lower observations."""
    record = cast(_Record, program.lifecycle)
    if prompt_tokens >= program.estimated_context_tokens:
        table.set_context(program, prompt_tokens)
        record.context_shrink_observations = 0
        return
    record.context_shrink_observations += 1
    if record.context_shrink_observations >= 2:
        table.set_context(program, prompt_tokens)
        record.context_shrink_observations = 0


def shared_prefix_lifetime(
    config: ProgramSchedulingConfig, factors: RankFactors | None, active_reasoning: int, capacity: int | None
) -> float:
    """How long one shared-prefix observation stays credible on a Rank (§3.15) of token ``capacity``."""
    if factors is None:
        return config.shared_prefix_freshness_warmup_seconds
    return shared_prefix_freshness_seconds(
        config.shared_prefix_freshness_warmup_seconds,
        config.shared_prefix_freshness_kv_turnovers,
        capacity,
        factors.average_e2e_seconds(),
        active_reasoning,
        factors.average_uncached_prompt_tokens(),
        factors.request_window_complete(),
    )


def future_relief(rank: RankPrograms, decode_buffer_tokens: int) -> int:
    """Private tokens that marked Reasoning Programs will give back at their idle boundary."""
    return sum(
        program_private_tokens(p, decode_buffer_tokens)
        for p in rank.marked
        if p.status is ProgramStatus.REASONING
    )


class Lifecycle:
    """Arrival, completion, Progress-TTL, segment yield, pause, paused retention and release."""

    __slots__ = (
        "_agenda",
        "_config",
        "_decode_buffer",
        "_fleet",
        "_keeper",
        "_ledger",
        "_lineage",
        "_max_hint_ttl",
        "_queues",
        "_request_pool",
        "_stats",
        "_table",
        "_telemetry",
        "_timers",
        "_ttl",
        "_yields",
        "paused_idle",
    )

    def __init__(
        self,
        config: ProgramSchedulingConfig,
        telemetry: Telemetry,
        table: ProgramTable,
        request_pool: RequestPool,
        ledger: CapacityLedger,
        queues: RankQueues,
        timers: Timers,
        agenda: Agenda,
        stats: RankStats,
        lineage: ProgramLineage,
        fleet: Fleet,
        keeper: ForceResumeKeeper,
        ttl: TTLPolicy,
    ) -> None:
        self._config = config
        self._telemetry = telemetry
        self._table = table
        self._request_pool = request_pool
        self._ledger = ledger
        self._queues = queues
        self._timers = timers
        self._agenda = agenda
        self._stats = stats
        self._lineage = lineage
        self._fleet = fleet
        self._keeper = keeper
        self._ttl = ttl
        self._decode_buffer = config.decode_buffer_tokens
        self._max_hint_ttl = config.max_kv_retention_ttl_seconds
        self._yields = not config.binding_only  # segment yield is a scheduling decision: none binding-only
        # idle Paused Programs, oldest first: past max_paused_programs the oldest is released
        self.paused_idle: dict[Program, None] = {}

    # arrival side
    @staticmethod
    def new_record(request: ProgramRequest, now: float) -> LifecycleRecord:
        """The record of a new generation (``ProgramTable.materialize`` puts it on the Program): paused since
        now, for no reason yet (never placed), at the request's step (0 without one)."""
        identity = request.identity
        return _Record(identity, identity.step_id if identity.step_id is not None else 0, Pause(now, None))

    def arrived(self, program: Program, request: ProgramRequest, now: float, *, new: bool) -> None:
        """A request of ``program`` arrived (``new``: its generation was just created from ``new_record``):
        its identity, step, context and hints are the request's now, and it is Reasoning until it is idle
        again."""
        record = cast(_Record, program.lifecycle)
        identity = request.identity
        if not new:
            self.record_continuity(program, now)
            record.identity = identity
            record.step_id = identity.step_id if identity.step_id is not None else record.step_id + 1
        self.paused_idle.pop(program, None)  # it has a request: not idle any more
        self._lineage.link(
            request.model_pool, identity.program_id, identity.parent_program_id, identity.root_program_id
        )
        if request.estimated_context_tokens > program.estimated_context_tokens:
            self._table.set_context(program, request.estimated_context_tokens)
        record.output_token_reservation = request.hints.expected_output_tokens
        record.last_hints = request.hints
        self._table.retain(program)

    def withdrawn_idle(self, program: Program, now: float) -> None:
        """A withdrawn request left the Program idle: one that never completed a request ends, a Paused one
        starts (or keeps) its retention clock."""
        record = cast(_Record, program.lifecycle)
        if record.completions.requests == 0:
            self.release(program, now)
        elif program.state is ProgramState.PAUSED:
            if record.pause is None:
                record.pause = Pause(now, None)
            self.arm_retention(program)

    def record_continuity(self, program: Program, now: float) -> None:
        """An idle Program came back: the gap since its last completion is a continuity sample of its Rank."""
        record = program.lifecycle
        finished = record.completions.last_finished_at
        rank_id = program.last_rank
        if program.in_flight or finished is None or rank_id is None or rank_id not in self._fleet.targets:
            return
        interval = max(0.0, now - finished)
        self._stats.of(rank_id).push_continuity(
            ContinuitySample(interval, program.last_cache_miss_impact_seconds)
        )
        if self._telemetry.observing:
            self._telemetry.observer.histogram("request_interval_seconds", interval, target=rank_id)
        if self._telemetry.debugging:
            self._telemetry.observer.event(
                "debug",
                "continuity_sample",
                program=program.redacted,
                target=rank_id,
                interval_seconds=interval,
                cache_miss_impact_seconds=program.last_cache_miss_impact_seconds,
            )

    # completion
    def complete(
        self,
        program: Program,
        dispatch: ProgramDispatch,
        now: float,
        *,
        success: bool,
        usage: UsageObservation | None,
        decode_seconds: float | None,
        terminate: bool,
    ) -> None:
        """Apply one (current-epoch) completion; the caller already checked it is not stale."""
        record = cast(_Record, program.lifecycle)
        config = self._config
        rank_id = dispatch.target.id
        factors = self._stats.of(rank_id)
        usage = usage or UsageObservation()
        prompt = usage.prompt_tokens if usage.prompt_tokens is not None else dispatch.estimated_context_tokens
        explicit_cached = usage.cached_tokens
        cached = min(
            prompt,
            explicit_cached if explicit_cached is not None else round(factors.average_cached_prompt_tokens()),
        )
        impact = completion_cache_miss_impact(config.prefill_cost_model, prompt, record.shared_prefix.tokens)
        idle = self._table.request_finished(program)
        if usage.prompt_tokens is not None:
            observe_context(self._table, program, usage.prompt_tokens)
        if success:
            continuous = self._segment_bookkeeping(
                program, dispatch, now, prompt, cached, explicit_cached, impact
            )
            previous = record.completions.last_context_tokens
            factors.push_request(
                RequestSample(  # (by position: keywords cost a dict per completion)
                    prompt,
                    usage.completion_tokens or 0,
                    cached,
                    context_growth(prompt, previous if previous > 0 else None),
                    max(0.0, now - dispatch.dispatched_at),  # end to end
                    decode_seconds,
                    dispatch.queued_seconds,
                    record.segment.rounds_since_ttl_pause,
                    now,  # finished at
                )
            )
            self._agenda.capacity_changed(rank_id)  # the growth reserve and target rounds may have moved
            record.completions = Completions(record.completions.requests + 1, now, prompt)
            self._table.count_completion(program, impact, round_served=continuous)
        record.output_token_reservation = None
        if program.state is ACTIVE and not program.pause_when_idle:
            self._ledger.recharge(program, program_private_tokens(program, config.decode_buffer_tokens))
        if idle:
            self._went_idle(program, dispatch, now, success=success, terminate=terminate, impact=impact)

    def _went_idle(
        self,
        program: Program,
        dispatch: ProgramDispatch,
        now: float,
        *,
        success: bool,
        terminate: bool,
        impact: float,
    ) -> None:
        """The completion left the Program idle: it ends, pauses, or keeps its placement for an acting TTL
        (the request's hint, else its TTL policy's) and may then yield its segment."""
        if terminate:
            self.release(program, now)
        elif program.pause_when_idle:
            self.pause(program, PauseReason.CAPACITY_REPAIR, now)
        elif not success:
            self.pause(program, PauseReason.REQUEST_FAILED, now)
        else:
            hint_ttl = dispatch.hints.kv_retention_ttl_seconds
            if hint_ttl is not None:
                self.arm_ttl(program, min(hint_ttl, self._max_hint_ttl), "request_hint", now)
            else:
                policy = self._ttl
                self.arm_ttl(program, policy.armed(program, dispatch.target.id, impact), policy.source, now)
            if program.state is ACTIVE and self._yields:
                self.segment_yield(program, now)

    def _segment_bookkeeping(
        self,
        program: Program,
        dispatch: ProgramDispatch,
        now: float,
        prompt: int,
        cached: int,
        explicit_cached: int | None,
        impact: float,
    ) -> bool:
        """Rounds and segments of a successful completion; a placement start that lost the cache begins a
        new segment and observes the shared prefix. Returns whether the round was continuous (the caller
        counts it with the completion's impact, in one move of the Rank's round histogram)."""
        record = cast(_Record, program.lifecycle)
        previous = record.completions.last_context_tokens
        continuous = cache_continuous(previous if previous > 0 else None, cached)
        segment = record.segment
        started_at, served = segment.started_at, segment.served_rounds
        if dispatch.placement_start_request and (previous <= 0 or not continuous):
            started_at, served = dispatch.dispatched_at, 0
            self._observe_shared_prefix(program, dispatch.target.id, explicit_cached, now)
        record.segment = Segment(
            started_at,
            served + 1,
            segment.ttl_pause_sampled_rounds,
            segment.rounds_since_ttl_pause + 1 if continuous else segment.rounds_since_ttl_pause,
        )
        if self._telemetry.observing:
            self._report_cache(
                program, dispatch, prompt, cached, explicit_cached, impact, previous, continuous
            )
        return continuous

    def _observe_shared_prefix(
        self, program: Program, rank_id: str, explicit_cached: int | None, now: float
    ) -> None:
        """A new segment observes the shared prefix, unless the last observation is still fresh."""
        record = cast(_Record, program.lifecycle)
        shared = record.shared_prefix
        if shared.observed and shared.fresh_until is not None and now < shared.fresh_until:
            return
        lifetime = shared_prefix_lifetime(
            self._config,
            self._stats.get(rank_id),
            len(self._table.ranks[rank_id].reasoning),
            self._ledger.capacity(rank_id),
        )
        # Missing cached usage is no evidence of a shared prefix: it observes 0.
        record.shared_prefix = SharedPrefix(explicit_cached or 0, True, now, now + lifetime)
        if explicit_cached is not None and self._telemetry.observing:
            self._telemetry.observer.histogram(
                "shared_prefix_observed_tokens", explicit_cached, target=rank_id
            )

    def _report_cache(
        self,
        program: Program,
        dispatch: ProgramDispatch,
        prompt: int,
        cached: int,
        explicit_cached: int | None,
        impact: float,
        previous: int,
        continuous: bool,
    ) -> None:
        record = program.lifecycle
        observer = self._telemetry.observer
        rank_id = dispatch.target.id
        if (
            explicit_cached is not None
            and previous > 0
            and not dispatch.placement_start_request
            and not continuous
        ):
            observer.event(
                "info",
                "unexpected_cache_discontinuity",
                program=program.redacted,
                target=rank_id,
                prompt_tokens=prompt,
                cached_tokens=explicit_cached,
                previous_context_tokens=previous,
                hit_ratio_vs_previous=explicit_cached / previous,
                uncached_tokens=max(0, prompt - explicit_cached),
                estimated_miss_tokens=max(0, previous - explicit_cached),
                cache_miss_impact_seconds=impact,
                segment_served_rounds=record.segment.served_rounds,
            )
        if self._telemetry.debugging:
            observer.event(
                "debug",
                "cache_observation",
                program=program.redacted,
                target=rank_id,
                prompt_tokens=prompt,
                cached_tokens=cached,
                explicit_cached=explicit_cached is not None,
                continuous=continuous,
                cache_miss_impact_seconds=impact,
            )
        observer.histogram("cache_miss_impact_seconds", impact, target=rank_id)

    # Progress-TTL
    def arm_ttl(self, program: Program, ttl: float, source: str, now: float) -> None:
        """Keep an idle Active Program's placement for ``ttl`` seconds; 0 pauses it at once."""
        record = cast(_Record, program.lifecycle)
        rank_id = program.placement
        assert rank_id is not None
        ttl = max(0.0, ttl)
        if self._telemetry.observing:
            self._telemetry.observer.histogram("armed_ttl_seconds", ttl, target=rank_id, source=source)
        if self._telemetry.debugging:
            self._telemetry.observer.event(
                "debug", "ttl_armed", program=program.redacted, target=rank_id, ttl_seconds=ttl, source=source
            )
        if ttl <= 0.0:
            self.expire_ttl(program, now)  # (no ActingTTL record: the pause would drop it at once)
        else:
            record.acting_ttl = ActingTTL(now, now + ttl)
            self._timers.arm(program, ACTING_TTL, now + ttl)

    def on_ttl_timer(self, program: Program, now: float) -> None:
        record = cast(_Record, program.lifecycle)
        acting = record.acting_ttl
        if program.phase != AA or acting is None:
            return
        deadline = acting.deadline
        if deadline <= now:
            hold = self._ttl.hold(program, program.placement or "", now - acting.since)
            if hold > 0.0:  # the weighed or adaptive TTL's check: held on
                record.acting_ttl, deadline = ActingTTL(acting.since, now + hold), now + hold
                self._timers.arm(program, ACTING_TTL, deadline)
                return
            self.expire_ttl(program, now)
        else:
            self._timers.arm(program, ACTING_TTL, deadline)

    def expire_ttl(self, program: Program, now: float) -> None:
        record = cast(_Record, program.lifecycle)
        rank_id = program.placement
        assert rank_id is not None
        segment = record.segment
        rounds = segment.served_rounds - segment.ttl_pause_sampled_rounds
        self._stats.of(rank_id).push_ttl_pause_rounds(max(0, rounds))
        record.segment = Segment(segment.started_at, segment.served_rounds, segment.served_rounds, 0)
        self.pause(program, _TTL_EXPIRED, now)

    # pause / release
    def pause(self, program: Program, reason: PauseReason, now: float) -> None:
        """An idle Active Program gives its placement up; its KV is no longer protected."""
        record = cast(_Record, program.lifecycle)
        released = self._ledger.charged(program)
        rank_id = self._table.pause(program)
        record.pause = Pause(now, reason)
        record.acting_ttl = None
        shared = record.shared_prefix
        anchor, fresh_until = shared.anchor_at, shared.fresh_until
        if anchor is not None and fresh_until is not None:  # its freshness restarts now
            lifetime = max(0.0, fresh_until - anchor)
            record.shared_prefix = SharedPrefix(shared.tokens, shared.observed, now, now + lifetime)
        if self._telemetry.observing:
            self._telemetry.observer.transition(rank_id, reason.value)
            self._telemetry.observer.event(
                "info",
                "program_pause",
                program=program.redacted,
                target=rank_id,
                reason=reason.value,
                released_private_tokens=released,
            )
        self.arm_retention(program)

    def arm_retention(self, program: Program) -> None:
        """An idle Paused Program is released ``paused_retention_ttl_seconds`` after it paused, or earlier
        by ``release_excess_paused``."""
        record = program.lifecycle
        assert record.pause is not None
        due = record.pause.at + self._config.paused_retention_ttl_seconds
        self._timers.arm(program, PAUSED_RETENTION, due)
        idle = self.paused_idle
        idle.pop(program, None)
        idle[program] = None

    def release_excess_paused(self, now: float) -> None:
        """More than ``max_paused_programs`` idle Paused Programs: release those that went idle longest
        ago. Run between events' steps (never inside a loop over Programs), so nobody is released under a
        caller."""
        idle = self.paused_idle
        while len(idle) > self._config.max_paused_programs:
            self.release(next(iter(idle)), now, reason="paused_retention_release")

    def on_retention_timer(self, program: Program, now: float) -> None:
        record = program.lifecycle
        pause = record.pause
        if program.phase != PA or pause is None:
            return  # it is waiting or Active again: the next pause arms a new release
        due = pause.at + self._config.paused_retention_ttl_seconds
        if due <= now:
            self.release(program, now, reason="paused_retention_release")
        else:
            self._timers.arm(program, PAUSED_RETENTION, due)

    def release(self, program: Program, now: float, *, reason: str | None = None) -> None:
        """End the generation: capacity, binding, queue entries and its lineage link go (its generation number
        stays fenced while it is among the most recently released)."""
        rank_id = program.placement or program.last_rank
        self._queues.remove(program)
        self._keeper.clear(program)
        self._table.release(program)
        self._timers.forget(program)
        self.paused_idle.pop(program, None)
        self._lineage.forget(program.ref.model_pool, program.ref.program_id)
        if reason is not None and rank_id is not None:
            self._telemetry.observer.transition(rank_id, reason)

    # segment yield
    def segment_yield(self, program: Program, now: float) -> None:
        """After ``max_segment_rounds`` continuous rounds, yield to a local waiter relief does not cover."""
        if program.rounds_since_activation < self._config.max_segment_rounds:
            return
        rank_id = program.placement
        assert rank_id is not None
        queue = self._queues.get(rank_id)
        waiter = None if queue is None else queue.first()
        if waiter is None:
            return
        decode_buffer = self._config.decode_buffer_tokens
        if required_tokens(waiter, self._request_pool.front_hints(waiter), decode_buffer) > future_relief(
            self._table.ranks[rank_id], decode_buffer
        ):
            self.pause(program, PauseReason.MAX_SEGMENT_YIELD, now)


class CapacityRepair:
    """Capacity repair of one Rank (§3.12): its projected usage against the watermarks, then pauses (through
    the ``Lifecycle``) and marks (the table's)."""

    __slots__ = ("_config", "_ledger", "_lifecycle", "_stats", "_table", "_telemetry")

    def __init__(
        self,
        config: ProgramSchedulingConfig,
        telemetry: Telemetry,
        table: ProgramTable,
        ledger: CapacityLedger,
        stats: RankStats,
        lifecycle: Lifecycle,
    ) -> None:
        self._config = config
        self._telemetry = telemetry
        self._table = table
        self._ledger = ledger
        self._stats = stats
        self._lifecycle = lifecycle

    def repair(self, rank_id: str, now: float) -> None:
        """Above the high watermark, pause idle Acting Programs and mark Reasoning ones by score (the Rank's
        capacity in force: a size that shrank below use is repaired here like any overfull Rank)."""
        capacity, config = self._ledger.capacity(rank_id), self._config
        high = watermark_tokens(capacity, config.high_watermark_ratio)
        low = watermark_tokens(capacity, config.low_watermark_ratio)
        if high is None or low is None:
            return
        rank = self._table.ranks[rank_id]
        if not rank.active_count:
            return
        factors = self._stats.get(rank_id)
        avg_completion = repair_average_completion(factors)
        decode_buffer = self._config.decode_buffer_tokens
        marked = [p for p in rank.marked if p.status is ProgramStatus.REASONING] if rank.marked else []
        projected = projected_usage(
            self._ledger.usage(rank_id, now),
            avg_completion,
            len(rank.reasoning),
            sum(program_private_tokens(p, decode_buffer) for p in marked) if marked else 0,  # (no generator)
            len(marked),
        )
        if projected <= high:
            return
        avg_prompt = 0.0 if factors is None else factors.average_prompt_tokens()
        victims: dict[int, Program] = {}
        candidates: list[RepairVictim] = []
        for program in rank.active():
            reasoning = program.status is ProgramStatus.REASONING
            if reasoning and (program.pause_when_idle or not program.in_flight):
                continue
            started = program.lifecycle.segment.started_at
            victim = RepairVictim(
                program_id=program.ref.program_id,
                reasoning=reasoning,
                score=repair_score(
                    0.0 if started is None else max(0.0, now - started),
                    program.estimated_context_tokens
                    if reasoning
                    else program.lifecycle.completions.last_context_tokens,
                    avg_prompt,
                ),
                private_tokens=program_private_tokens(program, decode_buffer),
            )
            victims[id(victim)] = program
            candidates.append(victim)
        for victim in plan_capacity_repair(projected, high, low, candidates, avg_completion):
            program = victims[id(victim)]
            if victim.reasoning:
                self._table.set_marked(program, True)
                self._telemetry.observer.transition(rank_id, "capacity_repair_mark")
            else:
                self._lifecycle.pause(program, PauseReason.CAPACITY_REPAIR, now)
