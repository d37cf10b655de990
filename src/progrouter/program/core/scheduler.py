"""``ProgramScheduler``: the sans-I/O Program scheduling core, driven by shells with an explicit ``now``.

The shell reports events — a request with Program identity arrives, a dispatched request completes, a client
goes away, a scrape of the Ranks' metrics begins and ends, time passes — and collects decisions with
``take_outcomes`` (``Dispatched``: send it to that Rank; ``TimedOut``: answer 429). ``next_deadline`` says
when the next time-driven decision falls due, so a shell can sleep exactly until then. Nothing here does
I/O, reads a clock, or logs: metrics and log events go to the ``SchedulerObserver``.

Each event first runs the timers that fell due (acting TTLs, paused retention, force-resume deadlines, queue
timeouts), then the event itself, then the decisions of the Ranks it touched (capacity repair, then admission
in resume order). ``tick`` adds what only the periodic pass does: repair on every Rank, cross-Rank resume
(``global_queue``), the capacity-accounting source changes, and the gauges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from progrouter.config import CrossRankGate, ProgramSchedulingConfig
from progrouter.program.core.admission import plan_binding_only
from progrouter.program.core.agenda import Agenda
from progrouter.program.core.binding import Binder, binding_candidates
from progrouter.program.core.demand import required_tokens
from progrouter.program.core.diagnostics import DEFAULT_PROGRAM_PAGE, Diagnostics, SchedulerView
from progrouter.program.core.dispatch import Dispatcher
from progrouter.program.core.factors import RankStats
from progrouter.program.core.fleet import Fleet
from progrouter.program.core.force_resume import ForceResumeKeeper
from progrouter.program.core.ledger import CapacityLedger, ObservationEpoch
from progrouter.program.core.lifecycle import CapacityRepair, Lifecycle, rebound
from progrouter.program.core.lineage import ProgramLineage
from progrouter.program.core.queues import RankQueues
from progrouter.program.core.rank_facts import RankViews
from progrouter.program.core.request_pool import PendingRequest, RequestHandle, RequestPool
from progrouter.program.core.resume import Resumer
from progrouter.program.core.state import AA, ACTIVE, PA, Program
from progrouter.program.core.table import ProgramTable
from progrouter.program.core.telemetry import Telemetry
from progrouter.program.core.timers import (
    ACTING_TTL,
    FORCE_RESUME,
    OBSERVATION_STALE,
    PAUSED_RETENTION,
    QUEUE_TIMEOUT,
    TimerKind,
    Timers,
)
from progrouter.program.observer import NullObserver, SchedulerObserver
from progrouter.program.outcomes import Dispatched, Outbox, Outcome, ProgramDispatch, ProgramRequest, TimedOut
from progrouter.program.residency import Report, ResidencyRules
from progrouter.program.types import BackendObservation, NoTargets, PoolFull, UsageObservation
from progrouter.program.variants.acting_ttl import acting_ttl
from progrouter.program.variants.migration import RecomputeCostGate
from progrouter.program.variants.warmup import stats_warmup
from progrouter.routing.prefix_tree import CacheAwareIndex
from progrouter.routing.target import Target


class SchedulerParts(NamedTuple):
    """The live components a test or an offline analysis of a run reads (bench/miss_causes.py); shells read
    the frozen ``view`` and ``diagnostics`` instead, and nobody changes a part but through the scheduler."""

    table: ProgramTable
    request_pool: RequestPool
    ledger: CapacityLedger
    stats: RankStats
    timers: Timers
    queues: RankQueues
    keeper: ForceResumeKeeper
    fleet: Fleet
    lineage: ProgramLineage
    views: RankViews


STALE_MARGIN_SECONDS = 1e-6  # past the freshness limit by more than float rounding, at any clock magnitude

__all__ = [
    "Dispatched",
    "ObservationEpoch",
    "Outcome",
    "ProgramDispatch",
    "ProgramRequest",
    "ProgramScheduler",
    "RequestHandle",
    "TimedOut",
]


class ProgramScheduler:
    """One scheduler for every model pool of a router. Not thread-safe: drive it from one task."""

    def __init__(
        self,
        config: ProgramSchedulingConfig,
        *,
        observer: SchedulerObserver | None = None,
        cache_index: CacheAwareIndex | None = None,
    ) -> None:
        self.config = config
        # the parts, each changed only through its own methods (every one is built here, once)
        self._telemetry = telemetry = Telemetry(observer or NullObserver())
        self._observer = telemetry.observer
        self._fleet = fleet = Fleet()
        self._request_pool = request_pool = RequestPool()
        self._agenda = agenda = Agenda()
        self._ledger = ledger = CapacityLedger(
            config.token_capacity_per_dp_rank, config.metrics_interval_seconds, agenda
        )
        self._table = table = ProgramTable(
            ledger, request_pool, config.max_segment_rounds, config.max_paused_programs
        )
        self._queues = queues = RankQueues(agenda, pool_order=config.global_queue)
        self._timers = timers = Timers()
        self._lineage = lineage = ProgramLineage()
        self._stats = stats = RankStats(config.stats_window_size)
        self._binder = binder = Binder(config, cache_index)
        self._outbox = outbox = Outbox()
        self._views = views = RankViews(config, table, stats, ledger)
        # the handlers, each given exactly what it reads and writes; variants chosen once
        warmup = stats_warmup(config)
        self._keeper = keeper = ForceResumeKeeper(config, table, stats, queues, timers, fleet)
        self._lifecycle = lifecycle = Lifecycle(
            config,
            telemetry,
            table,
            request_pool,
            ledger,
            queues,
            timers,
            agenda,
            stats,
            lineage,
            fleet,
            keeper,
            acting_ttl(config, stats, queues, warmup, ledger),
        )
        self._repair = (
            None
            if config.binding_only
            else CapacityRepair(config, telemetry, table, ledger, stats, lifecycle)
        )
        self._residency = (
            ResidencyRules(config, telemetry, table, fleet, lifecycle) if config.residency_aware else None
        )
        self._dispatcher = dispatcher = Dispatcher(
            config, telemetry, table, request_pool, ledger, fleet, binder, outbox
        )
        gate = (
            None
            if config.cross_rank_gate is CrossRankGate.SPEC
            else RecomputeCostGate(config, stats, table, ledger)
        )
        self._resumer = Resumer(
            config,
            telemetry,
            table,
            request_pool,
            queues,
            agenda,
            ledger,
            stats,
            fleet,
            views,
            keeper,
            dispatcher,
            self._residency,
            gate,
            warmup,
        )
        self._diagnostics = Diagnostics(
            config,
            telemetry.observer,
            table,
            request_pool,
            queues,
            ledger,
            stats,
            fleet,
            lineage,
            keeper,
            self._residency,
        )
        # read by every event's ``_decide`` (a pydantic model's attribute costs several plain ones)
        self._max_paused = config.max_paused_programs
        self._binding_only = config.binding_only
        self._cross_rank = config.global_queue and not config.binding_only
        self._queue_timeout = config.queue_timeout_seconds
        self._max_pooled = config.max_pooled_requests

    # --------------------------------------------------------------------------------------------- Ranks
    def set_ranks(self, model_pool: str, targets: Sequence[Target], now: float) -> None:
        """The healthy Ranks of a pool. Programs on a Rank that vanished fail over (``health_failover``)."""
        fleet = self._fleet
        self._advance(now)
        by_id = {t.id: t for t in targets}
        new_ids = sorted(by_id)
        old_ids = fleet.pool_ranks.get(model_pool)
        if old_ids == new_ids:
            fleet.targets.update(by_id)
            return
        removed = sorted(set(old_ids or ()) - set(new_ids))
        if removed or any(t not in fleet.targets for t in new_ids):
            self._ledger.rank_set_changed()  # a new pool over known Ranks keeps a scrape in progress valid
        fleet.pool_ranks[model_pool] = new_ids
        self._binder.pool_changed(model_pool)
        for rank_id, target in by_id.items():
            fleet.targets[rank_id] = target
            fleet.rank_pools.setdefault(rank_id, set()).add(model_pool)
            self._ledger.account(rank_id)
        moved: list[Program] = []
        for rank_id in removed:
            fleet.rank_pools[rank_id].discard(model_pool)
            rank = self._table.ranks[rank_id]
            moved.extend(p for p in rank.attributed if p.ref.model_pool == model_pool)
        if new_ids:
            moved.extend(self._table.unbound(model_pool))
        for program in sorted(moved, key=lambda p: p.serial):
            self._fail_over(program, now)
        for rank_id in removed:
            if not fleet.rank_pools[rank_id]:
                self._forget_rank(rank_id)
        self._decide(now)

    def _forget_rank(self, rank_id: str) -> None:
        fleet = self._fleet
        del fleet.rank_pools[rank_id]
        del fleet.targets[rank_id]
        self._stats.forget(rank_id)
        self._ledger.forget(rank_id)
        self._agenda.forget(rank_id)
        self._binder.remove_rank(rank_id)
        self._queues.drop_rank(rank_id)
        self._keeper.forget(rank_id)
        self._table.forget_rank(rank_id)

    def _fail_over(self, program: Program, now: float) -> None:
        """The Program's Rank left its pool: forget the placement, rebind by strategy, queue again."""
        old = program.last_rank
        self._table.invalidate(program)
        if old is not None:
            self._observer.transition(old, "health_failover")
        self._rebind(program, now)
        if self._request_pool.waiting(program):
            self._resumer.enqueue(program, now)
        elif program.phase == PA:
            self._lifecycle.arm_retention(program)

    def _rebind(self, program: Program, now: float) -> None:
        """A new home for a Paused Program by its binding strategy (None while its pool has no Rank)."""
        self._queues.remove(program)
        front = self._request_pool.front(program)
        home = self._bind(
            program.ref.model_pool,
            program.lifecycle.identity.placement_hash_key,
            None if front is None else front.routing_text,
            program.estimated_context_tokens,
            now,
        )
        self._table.rebind(program, home)
        rebound(program, now)

    def _bind(
        self, model_pool: str, hash_key: str, routing_text: str | None, context_tokens: int, now: float
    ) -> str | None:
        rank_ids = self._fleet.pool_ranks.get(model_pool)
        if not rank_ids:
            return None
        return self._binder.choose(
            model_pool,
            rank_ids,
            hash_key,
            routing_text,
            lambda: binding_candidates(
                self.config,
                self._views,
                self._queues,
                self._request_pool,
                self._ledger,
                rank_ids,
                context_tokens,
                now,
            ),
        )

    def tracked_ranks(self) -> list[Target]:
        """Ranks of the pools that have seen Program traffic: the ones worth polling."""
        fleet = self._fleet
        ids = {t for request_pool in fleet.tracked_pools for t in fleet.pool_ranks.get(request_pool, ())}
        return [fleet.targets[t] for t in sorted(ids)]

    # -------------------------------------------------------------------------------------------- events
    def arrive(self, now: float, request: ProgramRequest) -> RequestHandle:
        """Retain a request of a Program; it is dispatched now or later (see ``take_outcomes``)."""
        fleet, request_pool = self._fleet, self._request_pool
        self._advance(now)
        if not fleet.pool_ranks.get(request.model_pool):
            raise NoTargets()
        program = self._table.get(request.model_pool, request.identity.program_id)
        limit = self._max_pooled
        if len(request_pool) >= limit and (program is None or not program.active):
            raise PoolFull(limit)  # it would wait, and the pool is full: refused before anything changes
        fleet.tracked_pools.add(request.model_pool)
        new = program is None
        residency = self._residency
        if program is None:
            home = (None if residency is None else residency.initial_home(request)) or self._bind(
                request.model_pool,
                request.identity.placement_hash_key,
                request.routing_text,
                request.estimated_context_tokens,
                now,
            )
            program = self._table.materialize(
                now, request.model_pool, self._lifecycle.new_record(request, now), home
            )
        self._lifecycle.arrived(program, request, now, new=new)
        if residency is not None:
            residency.on_arrival(program, request, now)
        handle, timer_deadline = self._retain(program, request, now)
        home = program.last_rank  # a Paused Program whose home left its pool (or has none) gets a new one
        active = program.state is ACTIVE
        if not active and request.model_pool not in fleet.rank_pools.get(home or "", ()):
            self._rebind(program, now)
        if active:
            self._dispatcher.serve_active(program, now)
        elif self._binding_only and program.last_rank is not None:
            view = self._views.of(program.last_rank, now)
            required = required_tokens(
                program, request_pool.front_hints(program), self.config.decode_buffer_tokens
            )
            self._resumer.commit_admission(program, plan_binding_only(view, required), now)
        else:
            self._resumer.wait(program, now)
        self._decide(now)
        if timer_deadline is not None and request_pool.holds(handle.id):  # still retained: it may time out
            self._timers.add(timer_deadline, QUEUE_TIMEOUT, handle.id)
        return handle

    def _retain(
        self, program: Program, request: ProgramRequest, now: float
    ) -> tuple[RequestHandle, float | None]:
        """Keep the request in the pool until its Program dispatches it; returns its handle and, unless the
        pool keeps its queue deadline in order, that deadline (a timer's)."""
        request_pool = self._request_pool
        hints = request.hints
        timeout = self._queue_timeout
        if hints.deadline_seconds is not None:
            timeout = min(timeout, hints.deadline_seconds)
        handle = request_pool.new_handle(program)
        in_order = request_pool.push(
            program,
            PendingRequest(  # (by position: keywords cost a dict per request)
                handle,
                now,  # arrived at
                request.estimated_context_tokens,
                request.routing_text if self._binder.keeps_text else None,
                hints,
                now + timeout,  # its queue deadline
            ),
        )
        return handle, None if in_order else now + timeout

    def cancel(self, now: float, handle: RequestHandle) -> None:
        """The client of a retained request went away; a dispatched request is ``complete``d instead."""
        self._advance(now)
        if self._request_pool.owner(handle) is None:
            return
        self._withdraw(handle, now)
        self._decide(now)

    def _withdraw(self, handle: RequestHandle, now: float) -> None:
        """A retained request leaves unserved; an unstarted Program with nothing left is released."""
        request_pool = self._request_pool
        program = request_pool.owner(handle)
        removed = request_pool.remove(handle)
        assert program is not None and removed is not None
        _, was_front = removed
        idle = self._table.request_withdrawn(program)
        if not request_pool.waiting(program):
            self._resumer.stop_waiting(program)
        elif was_front:
            self._resumer.requeue(program, now)  # the new front brings its own priority
        if idle:
            self._lifecycle.withdrawn_idle(program, now)

    def complete(
        self,
        now: float,
        dispatch: ProgramDispatch,
        *,
        success: bool,
        usage: UsageObservation | None,
        decode_seconds: float | None = None,
        terminate: bool = False,
    ) -> None:
        """A dispatched request ended (success, failure or disconnect). Call exactly once per dispatch;
        ``terminate`` ends the Program when it is idle (the HTTP shell, like upstream, never sets it)."""
        self._advance(now)
        if self._outbox.settle(dispatch.handle.id) is None:
            return
        program = self._table.lookup(dispatch.program)
        if (
            program is None
            or program.placement_epoch != dispatch.placement_epoch
            or program.placement != dispatch.target.id
        ):
            if self._telemetry.debugging:
                self._observer.event(
                    "debug",
                    "stale_completion",
                    program=dispatch.program.redacted_id(),
                    target=dispatch.target.id,
                )
            return
        self._lifecycle.complete(
            program,
            dispatch,
            now,
            success=success,
            usage=usage,
            decode_seconds=decode_seconds,
            terminate=terminate,
        )
        self._decide(now)

    def tick(self, now: float) -> None:
        """The periodic pass (every ``metrics_interval_seconds``, and at ``next_deadline``)."""
        self._telemetry.attend()  # a log level changed since the last tick takes effect now
        self._advance(now)
        diagnostics = self._diagnostics
        diagnostics.report_accounting_sources(self._ledger.review_sources(self._fleet.targets, now), now)
        repair = self._repair
        if repair is not None:
            for rank_id in sorted(self._fleet.targets):
                repair.repair(rank_id, now)
        self._decide(now)
        if self._cross_rank:
            for model_pool in sorted(self._fleet.tracked_pools):
                self._resumer.cross_rank_pass(model_pool, now)
            self._decide(now)
        diagnostics.publish_gauges(now)

    # ------------------------------------------------------------------------------------- observations
    def begin_observation(self, now: float) -> ObservationEpoch:
        """Checkpoint the ledger of every known Rank before a scrape of their metrics starts."""
        ledger, ranks = self._ledger, self._table.ranks
        checkpoints = {t: ledger.checkpoint(t, ranks[t]) for t in self._fleet.targets}
        return ObservationEpoch(ledger.revision, now, checkpoints)

    def apply_observations(
        self, now: float, epoch: ObservationEpoch, observations: Mapping[str, BackendObservation]
    ) -> None:
        """What the scrape found, keyed by rank id. Dropped whole if the Rank set changed meanwhile."""
        ledger, observer = self._ledger, self._observer
        if epoch.revision != ledger.revision:
            observer.event(
                "warning",
                "stale_capacity_observation_dropped",
                epoch_revision=epoch.revision,
                current_revision=ledger.revision,
            )
            return
        self._advance(now)
        for rank_id, observed in observations.items():
            if observed.kv_capacity_tokens is not None:
                self._report_capacity(rank_id, observed.kv_capacity_tokens)
        stale_at = now + ledger.freshness_seconds + STALE_MARGIN_SECONDS
        for rank_id in ledger.apply(now, epoch, observations):
            self._timers.add(stale_at, OBSERVATION_STALE, rank_id)
            account = ledger.accounts[rank_id]
            observation = account.observation
            assert observation is not None
            if self._telemetry.debugging:
                observer.event(
                    "debug",
                    "capacity_observation",
                    target=rank_id,
                    kv_cache_usage=observation.kv_cache_usage,
                    running=observation.running,
                    waiting=observation.waiting,
                    estimated_active_program_tokens=account.est_active_program_tokens,
                    delta_since_checkpoint=account.delta,
                )
        self._decide(now)

    def report_kv_capacity(self, now: float, rank_id: str, tokens: int) -> None:
        """A live Rank's vLLM reports its KV size outside a scrape (a worker known at join: the simulator);
        under ``"auto"`` it becomes the Rank's token capacity, as a scrape's ``kv_capacity_tokens`` does."""
        self._advance(now)
        self._report_capacity(rank_id, tokens)
        self._decide(now)

    def _report_capacity(self, rank_id: str, tokens: int) -> None:
        ledger = self._ledger
        previous = ledger.capacity(rank_id)
        if ledger.report_capacity(rank_id, tokens):
            self._observer.event(
                "info", "token_capacity_reported", target=rank_id, tokens=tokens, previous=previous
            )

    def observe_residency(self, now: float, reports: Mapping[tuple[str, str], Report]) -> None:
        """``residency_aware``: per (model pool, Program id), its last prompt's full-block tokens and how many
        leading tokens of it each Rank with known KV events holds (``residency.py`` decides what changes)."""
        self._advance(now)
        if self._residency is not None:
            self._residency.apply_report(reports, now)
        self._decide(now)

    # ------------------------------------------------------------------------------------------ outputs
    def take_outcomes(self) -> list[Outcome]:
        return self._outbox.take()

    def next_deadline(self) -> float | None:
        """The earliest due time that still matters. Asking is not free of effect, on purpose: stale entries
        at the heap's top are dropped, and a moot Program entry with them its registration (``_timer_valid``),
        so the Program's next ``arm`` pushes a fresh entry instead of keeping the moot earlier one — which
        would fire early and cost the shell a needless tick."""
        timer = self._timers.next_time(self._timer_valid)
        pooled = self._request_pool.next_deadline()  # the queue timeouts the pool keeps in order
        return pooled if timer is None else timer if pooled is None else min(timer, pooled)

    def diagnostics(
        self, now: float, *, offset: int = 0, limit: int = DEFAULT_PROGRAM_PAGE
    ) -> dict[str, Any]:
        return self._diagnostics.snapshot(now, offset=offset, limit=limit)

    @property
    def binding_reads(self) -> tuple[bool, bool]:
        """What the binding strategy reads of a request: (its routing text, its placement hash key). The
        shell builds neither when it is not read (the key's body digest costs ~0.1 ms per 400 kB)."""
        return self._binder.keeps_text, self._binder.reads_hash_key

    @property
    def view(self) -> SchedulerView:
        """Read-only access for the shell's summaries (the dashboard)."""
        return SchedulerView(self._diagnostics, self._table, self._request_pool, self._fleet)

    @property
    def parts(self) -> SchedulerParts:
        return SchedulerParts(
            self._table,
            self._request_pool,
            self._ledger,
            self._stats,
            self._timers,
            self._queues,
            self._keeper,
            self._fleet,
            self._lineage,
            self._views,
        )

    # ---------------------------------------------------------------------------------------- internals
    def _timer_valid(self, when: float, kind: TimerKind, payload: object) -> bool:
        if kind is QUEUE_TIMEOUT:
            assert isinstance(payload, int)
            return self._request_pool.holds(payload)
        if kind is OBSERVATION_STALE:
            assert isinstance(payload, str)
            ledger = self._ledger
            observed_at = ledger.account(payload).observed_at if payload in self._fleet.targets else None
            return observed_at is not None and observed_at + ledger.freshness_seconds < when
        assert isinstance(payload, Program)
        if self._timers.due(payload, kind) != when or self._table.lookup(payload.ref) is not payload:
            return False
        if kind is ACTING_TTL:
            relevant = payload.phase == AA
        elif kind is FORCE_RESUME:
            relevant = self._queues.entry(payload) is not None
        else:
            relevant = payload.phase == PA
        if not relevant:  # it resumed, or left the queue: the entry goes, and so does its registration
            self._timers.fired(payload, kind, when)
        return relevant

    def _advance(self, now: float) -> None:
        """Run the timers due at ``now``: TTL expiry, retention, observation expiry, force deadlines; queue
        timeouts last, so a force resume due at the same instant is tried first."""
        timers, request_pool = self._timers, self._request_pool
        timers.compact(self._timer_valid)
        due = timers.pop_due(now)
        timeouts = request_pool.expired(now)  # (deadline, handle id): the pool's, and the timers' below
        if not due and not timeouts:
            return
        lifecycle, table = self._lifecycle, self._table
        for when, kind, payload in due:
            if kind is QUEUE_TIMEOUT:
                assert isinstance(payload, int)
                timeouts.append((when, payload))
            elif kind is OBSERVATION_STALE:  # the waiting gate and backend usage lapse now
                assert isinstance(payload, str)
                if payload in self._fleet.targets and self._ledger.fresh_observation(payload, now) is None:
                    self._agenda.capacity_changed(payload)
            else:
                assert isinstance(payload, Program)
                if table.lookup(payload.ref) is not payload or not timers.fired(payload, kind, when):
                    continue
                if kind is ACTING_TTL:
                    lifecycle.on_ttl_timer(payload, now)
                elif kind is PAUSED_RETENTION:
                    lifecycle.on_retention_timer(payload, now)
                else:
                    self._resumer.on_force_timer(payload, now)
        self._decide(now)
        timeouts.sort()  # (time, arrival) order: a timer's sequence number is its request's arrival order
        for _, handle_id in timeouts:
            request = request_pool.retained(handle_id)
            if request is not None and request.queue_deadline <= now:
                self._withdraw(request.handle, now)
                self._outbox.timed_out(request.handle)
        self._decide(now)

    def _decide(self, now: float) -> None:
        """Repair and schedule every Rank whose capacity changed or that has new candidates."""
        lifecycle = self._lifecycle
        if len(lifecycle.paused_idle) > self._max_paused:
            lifecycle.release_excess_paused(now)
        agenda, targets, repair, resumer = self._agenda, self._fleet.targets, self._repair, self._resumer
        while due := agenda.take():
            for rank_id, full in due:
                if rank_id not in targets:
                    agenda.settled(rank_id)
                    continue
                if full and repair is not None:
                    repair.repair(rank_id, now)
                resumer.schedule_rank(rank_id, now, full=full)
                agenda.settled(rank_id)
