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
from typing import Any

from progrouter.config import ProgramSchedulingConfig
from progrouter.program import lifecycle, residency
from progrouter.program.admission import plan_binding_only
from progrouter.program.binding import binding_candidates
from progrouter.program.core import Core
from progrouter.program.diagnostics import (
    DEFAULT_PROGRAM_PAGE,
    SchedulerView,
    publish_gauges,
    report_accounting_sources,
    snapshot,
)
from progrouter.program.dispatch import serve_active
from progrouter.program.ledger import ObservationEpoch
from progrouter.program.observer import NullObserver, SchedulerObserver
from progrouter.program.outcomes import Dispatched, Outcome, ProgramDispatch, ProgramRequest, TimedOut
from progrouter.program.pool import PendingRequest, RequestHandle
from progrouter.program.resume import (
    commit_admission,
    cross_rank_pass,
    enqueue,
    on_force_timer,
    requeue,
    schedule_target,
    stop_waiting,
    wait,
)
from progrouter.program.state import AA, ACTIVE, PA, Program
from progrouter.program.timers import (
    ACTING_TTL,
    FORCE_RESUME,
    OBSERVATION_STALE,
    PAUSED_RETENTION,
    QUEUE_TIMEOUT,
    TimerKind,
)
from progrouter.program.types import BackendObservation, NoTargets, PoolFull, UsageObservation
from progrouter.routing.prefix_tree import CacheAwareIndex
from progrouter.routing.target import Target

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
        self._core = Core(config, observer or NullObserver(), cache_index)
        # read by every event's ``_decide`` (a pydantic model's attribute costs several plain ones)
        self._max_paused = config.max_paused_programs
        self._repair = not config.binding_only

    # ------------------------------------------------------------------------------------------- targets
    def set_targets(self, model_pool: str, targets: Sequence[Target], now: float) -> None:
        """The healthy Ranks of a pool. Programs on a Rank that vanished fail over (``health_failover``)."""
        core = self._core
        self._advance(now)
        by_id = {t.id: t for t in targets}
        new_ids = sorted(by_id)
        old_ids = core.pool_targets.get(model_pool)
        if old_ids == new_ids:
            core.targets.update(by_id)
            return
        removed = sorted(set(old_ids or ()) - set(new_ids))
        if removed or any(t not in core.targets for t in new_ids):
            core.ledger.rank_set_changed()  # a new pool over known Ranks keeps a scrape in progress valid
        core.pool_targets[model_pool] = new_ids
        core.binder.pool_changed(model_pool)
        for target_id, target in by_id.items():
            core.targets[target_id] = target
            core.target_pools.setdefault(target_id, set()).add(model_pool)
            core.ledger.account(target_id)
        moved: list[Program] = []
        for target_id in removed:
            core.target_pools[target_id].discard(model_pool)
            rank = core.table.ranks[target_id]
            moved.extend(p for p in rank.attributed if p.ref.model_pool == model_pool)
        if new_ids:
            moved.extend(core.table.unbound(model_pool))
        for program in sorted(moved, key=lambda p: p.serial):
            self._fail_over(program, now)
        for target_id in removed:
            if not core.target_pools[target_id]:
                self._forget_target(target_id)
        self._decide(now)

    def _forget_target(self, target_id: str) -> None:
        core = self._core
        del core.target_pools[target_id]
        del core.targets[target_id]
        core.factors.pop(target_id, None)
        core.ledger.forget(target_id)
        core.agenda.forget(target_id)
        core.binder.remove_target(target_id)
        core.queues.drop_target(target_id)
        core.work.forget(target_id)
        core.table.forget_rank(target_id)

    def _fail_over(self, program: Program, now: float) -> None:
        """The Program's Rank left its pool: forget the placement, rebind by strategy, queue again."""
        core = self._core
        old = program.last_target
        core.table.invalidate(program)
        if old is not None:
            core.observer.transition(old, "health_failover")
        self._rebind(program, now)
        if core.pool.waiting(program):
            enqueue(core, program, now)
        elif program.phase == PA:
            lifecycle.arm_retention(core, program)

    def _rebind(self, program: Program, now: float) -> None:
        """A new home for a Paused Program by its binding strategy (None while its pool has no Rank)."""
        core = self._core
        core.queues.remove(program)
        front = core.pool.front(program)
        home = self._bind(
            program.ref.model_pool,
            program.identity.placement_hash_key,
            None if front is None else front.routing_text,
            program.estimated_context_tokens,
            now,
        )
        core.table.rebind(program, home)
        lifecycle.rebound(program, now)

    def _bind(
        self, model_pool: str, hash_key: str, routing_text: str | None, context_tokens: int, now: float
    ) -> str | None:
        core = self._core
        target_ids = core.pool_targets.get(model_pool)
        if not target_ids:
            return None
        return core.binder.choose(
            model_pool,
            target_ids,
            hash_key,
            routing_text,
            lambda: binding_candidates(core, model_pool, context_tokens, now),
            self.config.token_capacity_per_dp_rank,
        )

    def tracked_targets(self) -> list[Target]:
        """Ranks of the pools that have seen Program traffic: the ones worth polling."""
        core = self._core
        ids = {t for pool in core.tracked_pools for t in core.pool_targets.get(pool, ())}
        return [core.targets[t] for t in sorted(ids)]

    # -------------------------------------------------------------------------------------------- events
    def arrive(self, now: float, request: ProgramRequest) -> RequestHandle:
        """Retain a request of a Program; it is dispatched now or later (see ``take_outcomes``)."""
        core = self._core
        self._advance(now)
        if not core.pool_targets.get(request.model_pool):
            raise NoTargets()
        program = core.table.get(request.model_pool, request.identity.program_id)
        limit = self.config.max_pooled_requests
        if len(core.pool) >= limit and (program is None or not program.active):
            raise PoolFull(limit)  # it would wait, and the pool is full: refused before anything changes
        core.tracked_pools.add(request.model_pool)
        new = program is None
        if program is None:
            home = residency.initial_home(core, request) or self._bind(
                request.model_pool,
                request.identity.placement_hash_key,
                request.routing_text,
                request.estimated_context_tokens,
                now,
            )
            program = core.table.materialize(now, request.model_pool, request.identity, home)
        lifecycle.arrived(core, program, request, now, new=new)
        residency.on_arrival(core, program, request, now)
        handle, timer_deadline = self._retain(program, request, now)
        home = program.last_target  # a Paused Program whose home left its pool (or has none) gets a new one
        active = program.state is ACTIVE
        if not active and request.model_pool not in core.target_pools.get(home or "", ()):
            self._rebind(program, now)
        if active:
            serve_active(core, program, now)
        elif self.config.binding_only and program.last_target is not None:
            commit_admission(core, program, plan_binding_only(core, program, now), now)
        else:
            wait(core, program, now)
        self._decide(now)
        if timer_deadline is not None and core.pool.holds(handle.id):  # still retained: it may time out
            core.timers.add(timer_deadline, QUEUE_TIMEOUT, handle.id)
        return handle

    def _retain(
        self, program: Program, request: ProgramRequest, now: float
    ) -> tuple[RequestHandle, float | None]:
        """Keep the request in the pool until its Program dispatches it; returns its handle and, unless the
        pool keeps its queue deadline in order, that deadline (a timer's)."""
        core = self._core
        hints = request.hints
        timeout = self.config.queue_timeout_seconds
        if hints.deadline_seconds is not None:
            timeout = min(timeout, hints.deadline_seconds)
        handle = core.pool.new_handle(program)
        in_order = core.pool.push(
            program,
            PendingRequest(  # (by position: keywords cost a dict per request)
                handle,
                now,  # arrived at
                request.estimated_context_tokens,
                request.routing_text if core.binder.keeps_text else None,
                hints,
                now + timeout,  # its queue deadline
            ),
        )
        return handle, None if in_order else now + timeout

    def cancel(self, now: float, handle: RequestHandle) -> None:
        """The client of a retained request went away; a dispatched request is ``complete``d instead."""
        core = self._core
        self._advance(now)
        if core.pool.owner(handle) is None:
            return
        self._withdraw(handle, now)
        self._decide(now)

    def _withdraw(self, handle: RequestHandle, now: float) -> None:
        """A retained request leaves unserved; an unstarted Program with nothing left is released."""
        core = self._core
        program = core.pool.owner(handle)
        removed = core.pool.remove(handle)
        assert program is not None and removed is not None
        _, was_front = removed
        idle = core.table.request_withdrawn(program)
        if not core.pool.waiting(program):
            stop_waiting(core.queues, program)
        elif was_front:
            requeue(core, program, now)  # the new front brings its own priority
        if idle:
            lifecycle.withdrawn_idle(core, program, now)

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
        core = self._core
        self._advance(now)
        if core.outstanding.pop(dispatch.handle.id, None) is None:
            return
        program = core.table.lookup(dispatch.program)
        if (
            program is None
            or program.placement_epoch != dispatch.placement_epoch
            or program.placement != dispatch.target.id
        ):
            if core.debugging:
                core.observer.event(
                    "debug",
                    "stale_completion",
                    program=dispatch.program.redacted_id(),
                    target=dispatch.target.id,
                )
            return
        lifecycle.complete(
            core,
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
        core = self._core
        core.attend()  # a log level changed since the last tick takes effect now
        self._advance(now)
        report_accounting_sources(core, core.ledger.review_sources(core.targets, now), now)
        if not self.config.binding_only:
            for target_id in sorted(core.targets):
                lifecycle.capacity_repair(core, target_id, now)
        self._decide(now)
        if self.config.global_queue and not self.config.binding_only:
            for model_pool in sorted(core.tracked_pools):
                cross_rank_pass(core, model_pool, now)
            self._decide(now)
        publish_gauges(core, now)

    # ------------------------------------------------------------------------------------- observations
    def begin_observation(self, now: float) -> ObservationEpoch:
        """Checkpoint the ledger of every known Rank before a scrape of their metrics starts."""
        core = self._core
        checkpoints = {t: core.ledger.checkpoint(t, core.table.ranks[t]) for t in core.targets}
        return ObservationEpoch(core.ledger.revision, now, checkpoints)

    def apply_observations(
        self, now: float, epoch: ObservationEpoch, observations: Mapping[str, BackendObservation]
    ) -> None:
        """What the scrape found, keyed by target id. Dropped whole if the Rank set changed meanwhile."""
        core = self._core
        if epoch.revision != core.ledger.revision:
            core.observer.event(
                "warning",
                "stale_capacity_observation_dropped",
                epoch_revision=epoch.revision,
                current_revision=core.ledger.revision,
            )
            return
        self._advance(now)
        stale_at = now + core.ledger.freshness_seconds + STALE_MARGIN_SECONDS
        for target_id in core.ledger.apply(now, epoch, observations):
            core.timers.add(stale_at, OBSERVATION_STALE, target_id)
            account = core.ledger.accounts[target_id]
            observation = account.observation
            assert observation is not None
            if core.debugging:
                core.observer.event(
                    "debug",
                    "capacity_observation",
                    target=target_id,
                    kv_cache_usage=observation.kv_cache_usage,
                    running=observation.running,
                    waiting=observation.waiting,
                    estimated_active_program_tokens=account.est_active_program_tokens,
                    delta_since_checkpoint=account.delta,
                )
        self._decide(now)

    def observe_residency(self, now: float, reports: Mapping[tuple[str, str], residency.Report]) -> None:
        """``residency_aware``: per (model pool, Program id), its last prompt's full-block tokens and how many
        leading tokens of it each Rank with known KV events holds (``residency.py`` decides what changes)."""
        self._advance(now)
        residency.apply_report(self._core, reports, now)
        self._decide(now)

    # ------------------------------------------------------------------------------------------ outputs
    def take_outcomes(self) -> list[Outcome]:
        core = self._core
        outcomes, core.outcomes = core.outcomes, []
        return outcomes

    def next_deadline(self) -> float | None:
        """The earliest due time that still matters. Asking is not free of effect, on purpose: stale entries
        at the heap's top are dropped, and a moot Program entry with them its registration (``_timer_valid``),
        so the Program's next ``arm`` pushes a fresh entry instead of keeping the moot earlier one — which
        would fire early and cost the shell a needless tick."""
        core = self._core
        timer = core.timers.next_time(self._timer_valid)
        pooled = core.pool.next_deadline()  # the queue timeouts the pool keeps in order
        return pooled if timer is None else timer if pooled is None else min(timer, pooled)

    def diagnostics(
        self, now: float, *, offset: int = 0, limit: int = DEFAULT_PROGRAM_PAGE
    ) -> dict[str, Any]:
        return snapshot(self._core, now, offset=offset, limit=limit)

    @property
    def view(self) -> SchedulerView:
        """Read-only access for the shell's summaries (the dashboard)."""
        return SchedulerView(self._core)

    # ---------------------------------------------------------------------------------------- internals
    def _timer_valid(self, when: float, kind: TimerKind, payload: object) -> bool:
        core = self._core
        if kind is QUEUE_TIMEOUT:
            assert isinstance(payload, int)
            return core.pool.holds(payload)
        if kind is OBSERVATION_STALE:
            assert isinstance(payload, str)
            observed_at = core.ledger.account(payload).observed_at if payload in core.targets else None
            return observed_at is not None and observed_at + core.ledger.freshness_seconds < when
        assert isinstance(payload, Program)
        if payload.timer_due.get(kind) != when or core.table.lookup(payload.ref) is not payload:
            return False
        if kind is ACTING_TTL:
            relevant = payload.phase == AA
        elif kind is FORCE_RESUME:
            relevant = payload.queue_entry is not None
        else:
            relevant = payload.phase == PA
        if not relevant:  # it resumed, or left the queue: the entry goes, and so does its registration
            core.timers.fired(payload, kind, when)
        return relevant

    def _advance(self, now: float) -> None:
        """Run the timers due at ``now``: TTL expiry, retention, observation expiry, force deadlines; queue
        timeouts last, so a force resume due at the same instant is tried first."""
        core = self._core
        timers = core.timers
        timers.compact(self._timer_valid)
        due = timers.pop_due(now)
        timeouts = core.pool.expired(now)  # (deadline, handle id): the pool's, and the timers' below
        if not due and not timeouts:
            return
        for when, kind, payload in due:
            if kind is QUEUE_TIMEOUT:
                assert isinstance(payload, int)
                timeouts.append((when, payload))
            elif kind is OBSERVATION_STALE:  # the waiting gate and backend usage lapse now
                assert isinstance(payload, str)
                if payload in core.targets and core.ledger.fresh_observation(payload, now) is None:
                    core.agenda.capacity_changed(payload)
            else:
                assert isinstance(payload, Program)
                if core.table.lookup(payload.ref) is not payload or not core.timers.fired(
                    payload, kind, when
                ):
                    continue
                if kind is ACTING_TTL:
                    lifecycle.on_ttl_timer(core, payload, now)
                elif kind is PAUSED_RETENTION:
                    lifecycle.on_retention_timer(core, payload, now)
                else:
                    on_force_timer(core, payload, now)
        self._decide(now)
        timeouts.sort()  # (time, arrival) order: a timer's sequence number is its request's arrival order
        for _, handle_id in timeouts:
            request = core.pool.retained(handle_id)
            if request is not None and request.queue_deadline <= now:
                self._withdraw(request.handle, now)
                core.outcomes.append(TimedOut(request.handle))
        self._decide(now)

    def _decide(self, now: float) -> None:
        """Repair and schedule every Rank whose capacity changed or that has new candidates."""
        core = self._core
        if len(core.paused_idle) > self._max_paused:
            lifecycle.release_excess_paused(core, now)
        agenda = core.agenda
        repair = self._repair
        while due := agenda.take():
            for target_id, full in due:
                if target_id not in core.targets:
                    agenda.settled(target_id)
                    continue
                if full and repair:
                    lifecycle.capacity_repair(core, target_id, now)
                schedule_target(core, target_id, now, full=full)
                agenda.settled(target_id)
