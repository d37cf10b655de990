"""Resume: which waiting Program gets the next placement, local-first.

``Resumer`` queues waiting Programs and runs the scheduling passes (local and cross-Rank) that commit
admissions, in resume order (resume_order.py); ``force_resume.ForceResumeKeeper`` freezes each queued
Program's force-resume deadline and arms its timer.

Each Rank queue is a sorted list of keys, keyed by the Program's last Rank (in ``global_queue`` mode too: the
local-first pass is exactly "each Rank schedules its own waiters"). A key changes only when its inputs do
(the force deadline passes, the front request leaves), so it is re-inserted then. A scheduling pass scans a
queue in order only when the Rank's capacity state changed (``Agenda``); otherwise only the
Programs queued or re-keyed since the last pass (``pending``) are planned, because every other candidate was
already refused against the very same Rank state. Scanning stops early when a refusal applies to everyone
behind (the waiting gate, the count guard for non-forced candidates).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from progrouter.config import ProgramSchedulingConfig
from progrouter.program.core import lifecycle
from progrouter.program.core.admission import AdmissionPlan, Rejection, count_fits, plan, uncached_tokens
from progrouter.program.core.demand import required_tokens
from progrouter.program.core.records import ForceResume, QueueEntry, QueueKey
from progrouter.program.core.resume_order import cross_rank_key, forced, local_key, queued_at
from progrouter.program.types import BackendObservation, RequestHints

if TYPE_CHECKING:
    from progrouter.program.core.admission import RankView
    from progrouter.program.core.agenda import Agenda
    from progrouter.program.core.dispatch import Dispatcher
    from progrouter.program.core.factors import RankStats
    from progrouter.program.core.fleet import Fleet
    from progrouter.program.core.force_resume import ForceResumeKeeper
    from progrouter.program.core.ledger import CapacityLedger
    from progrouter.program.core.queues import RankQueue, RankQueues
    from progrouter.program.core.rank_facts import RankViews
    from progrouter.program.core.request_pool import RequestPool
    from progrouter.program.core.state import Program
    from progrouter.program.core.table import ProgramTable
    from progrouter.program.core.telemetry import Telemetry
    from progrouter.program.residency import ResidencyRules
    from progrouter.program.variants.migration import RecomputeCostGate
    from progrouter.program.variants.warmup import Warmup


_COUNT = Rejection.COUNT


class Resumer:
    """Waiting Programs in their Rank queues, and the passes that admit them: each Rank's own queue in resume
    order, then (``global_queue``) across the Ranks of a pool. ``residency``: the exact-residency rules, or
    None when ``residency_aware`` is off; ``gate``: the cross-Rank gate beyond the spec's, or None."""

    __slots__ = (
        "_agenda",
        "_config",
        "_dispatcher",
        "_fleet",
        "_gate",
        "_keeper",
        "_ledger",
        "_queues",
        "_request_pool",
        "_residency",
        "_stats",
        "_table",
        "_telemetry",
        "_views",
        "_warmup",
    )

    def __init__(
        self,
        config: ProgramSchedulingConfig,
        telemetry: Telemetry,
        table: ProgramTable,
        request_pool: RequestPool,
        queues: RankQueues,
        agenda: Agenda,
        ledger: CapacityLedger,
        stats: RankStats,
        fleet: Fleet,
        views: RankViews,
        keeper: ForceResumeKeeper,
        dispatcher: Dispatcher,
        residency: ResidencyRules | None,
        gate: RecomputeCostGate | None,
        warmup: Warmup,
    ) -> None:
        self._config = config
        self._telemetry = telemetry
        self._table = table
        self._request_pool = request_pool
        self._queues = queues
        self._agenda = agenda
        self._ledger = ledger
        self._stats = stats
        self._fleet = fleet
        self._views = views
        self._keeper = keeper
        self._dispatcher = dispatcher
        self._residency = residency
        self._gate = gate
        self._warmup = warmup

    def wait(self, program: Program, now: float) -> None:
        """A Paused Program got a request: it waits in its Rank queue (planned again if it was queued already:
        its demand grew)."""
        if self._queues.entry(program) is not None:
            self.requeue(program, now)
        else:
            self.enqueue(program, now)

    def enqueue(self, program: Program, now: float) -> None:
        """Queue a Paused Program with retained requests on its last Rank, freezing its force deadline."""
        if program.last_rank is None or self._queues.entry(program) is not None:
            return
        front = self._request_pool.front_hints(program)
        force = self._keeper.record(program)
        key = None
        if force is None:
            key = self._keeper.freeze(program, front, now)
        else:
            self._keeper.rearm(program, force)
        self._insert(program, front, now, key)

    def _insert(
        self, program: Program, front: RequestHints | None, now: float, key: QueueKey | None = None
    ) -> None:
        """Queue ``program`` under its key and demand now; ``front``: the hints of its front request; ``key``:
        its ``local_key`` now, if the caller has it."""
        config = self._config
        required = required_tokens(program, front, config.decode_buffer_tokens)
        force = self._keeper.record(program)
        if key is None:
            key = local_key(program, force, front, config.resume_order, now)
        forced_at = math.inf if force is None else force.deadline
        self._queues.insert(program, QueueEntry(key, required, uncached_tokens(program), forced_at))

    def requeue(self, program: Program, now: float) -> None:
        """Re-insert a queued Program whose ordering or demand inputs changed (forced, front, new request)."""
        if self._queues.entry(program) is None:
            return
        self._queues.remove(program)
        self._insert(program, self._request_pool.front_hints(program), now)

    def on_force_timer(self, program: Program, now: float) -> None:
        """A force deadline passed: the queued Program moves into the forced tier (and is planned again)."""
        force = self._keeper.record(program)
        if force is None or self._queues.entry(program) is None:
            return
        if force.deadline <= now:
            self.requeue(program, now)
        else:
            self._keeper.rearm(program, force)

    def stop_waiting(self, program: Program) -> None:
        """The Program leaves its queue for good (admitted, or nothing left to wait for): its wait and force
        deadline end with it."""
        self._queues.remove(program)
        self._keeper.clear(program)

    # admission
    def commit_admission(self, program: Program, plan: AdmissionPlan, now: float) -> None:
        """Activate ``program`` on the planned Rank and dispatch its retained requests."""
        previous = program.last_rank
        rank_id = plan.rank_id
        self.stop_waiting(program)
        self._table.activate(program, rank_id, plan.required, overflow=plan.overflow)
        lifecycle.activated(program, now)
        if self._telemetry.observing:
            self._report_admission(plan, previous, program.redacted, now)
        self._dispatcher.dispatch_retained(program, now)

    def _report_admission(self, plan: AdmissionPlan, previous: str | None, program: str, now: float) -> None:
        """The admission's log event, histograms and transitions (``program``: the redacted id)."""
        observer = self._telemetry.observer
        rank_id = plan.rank_id
        observer.event(
            "info",
            "program_admit",
            program=program,
            target=rank_id,
            forced=plan.forced,
            batch_gain=plan.batch_gain,
            active_programs=plan.active,
            used_tokens=plan.used,
            required_tokens=plan.required,
            reserve_tokens=plan.reserve,
            capacity_tokens=plan.capacity,
        )
        if not self._config.binding_only:
            self._admission_histograms(plan, now)
        reason = "force_resume" if plan.forced else "batch_gain_admit" if plan.batch_gain else "program_admit"
        observer.transition(rank_id, reason)
        if previous is not None and previous != rank_id:
            observer.transition(rank_id, "cross_rank_resume")

    def _admission_histograms(self, plan: AdmissionPlan, now: float) -> None:
        observer = self._telemetry.observer
        rank_id = plan.rank_id
        observer.histogram("admission_used_tokens", plan.used, target=rank_id)
        observer.histogram("admission_required_tokens", plan.required, target=rank_id)
        observer.histogram("admission_growth_reserve_tokens", plan.reserve, target=rank_id)
        capacity = plan.capacity
        if capacity is not None:
            observer.histogram("admission_capacity_pressure_ratio", plan.used / capacity, target=rank_id)
            projected = (plan.used + plan.required + plan.reserve) / capacity
            observer.histogram("admission_projected_pressure_ratio", projected, target=rank_id)
        account = self._ledger.accounts.get(rank_id)
        observation: BackendObservation | None = None if account is None else account.observation
        if account is not None and observation is not None and account.observed_at is not None:
            observer.histogram("admission_backend_kv_usage_ratio", observation.kv_cache_usage, target=rank_id)
            observer.histogram("admission_backend_running_requests", observation.running, target=rank_id)
            observer.histogram("admission_backend_waiting_requests", observation.waiting, target=rank_id)
            age = max(0.0, now - account.observed_at)
            observer.histogram("admission_capacity_observation_age_seconds", age, target=rank_id)

    # scheduling
    def schedule_rank(self, rank_id: str, now: float, *, full: bool) -> None:
        """Admit waiters of one Rank in resume order until nobody else fits."""
        queue = self._queues.get(rank_id)
        agenda = self._agenda
        while queue is not None and len(queue):
            if full:
                queue.pending.clear()
                entries = None
            else:
                pending = queue.take_pending()
                if not pending:
                    return
                entries = [entry for program in pending if (entry := queue.entry(program)) is not None]
            if self._count_refuses_all(rank_id, queue, entries, now):
                return
            if not full and self._refused_as_before(rank_id, pending, now):
                return
            agenda.settled(rank_id)
            view = self._views.of(rank_id, now)
            agenda.examined(view)
            if view.gate_blocked:
                return
            least = queue.bounds()
            unforced_possible = view.admits_some(least[0], least[1])
            if full:
                hopeless = _hopeless(view, now)
                if hopeless(*least):
                    return  # then every block is: nobody can be admitted
                candidates = _screened(
                    view, queue.entries(hopeless), now, unforced_possible, view.demand_limit
                )
            else:
                assert entries is not None
                entries.sort()  # resume order: by key (a key is unique, so nothing behind it is compared)
                candidates = _screened(view, entries, now, unforced_possible, math.inf)
            for key in candidates:
                program = queue.program(key)
                entry = queue.entry(program)
                assert entry is not None
                result = plan(view, program, entry, now)
                if isinstance(result, AdmissionPlan):
                    self.commit_admission(program, result, now)
                    break
                if result is _COUNT and not forced(self._keeper.record(program), now):
                    return
            else:
                return
            full = True  # the commit changed the Rank: everyone is a candidate again

    def _count_refuses_all(
        self, rank_id: str, queue: RankQueue, entries: list[QueueEntry] | None, now: float
    ) -> bool:
        """Whether the count guard alone refuses every candidate (the queue's, or only ``entries``), so
        the pass needs no ``RankView``: it refuses every unforced one whatever the Rank's other facts, and a
        forced one passes a refusal only while the Rank holds no admission past its limits (``plan``). (A
        full Rank's common case: the pass after an admission, an arrival behind it.)"""
        rank = self._table.ranks[rank_id]
        if count_fits(rank.active_count, self._config):
            return False
        if rank.overflow is not None:
            return True
        if entries is None:
            return queue.bounds()[2] > now
        forced_at = entries[0].forced_at if entries else math.inf  # the earliest, found as ``min`` finds it
        for entry in entries:  # (no generator: one or two entries, on every event)
            if entry.forced_at < forced_at:
                forced_at = entry.forced_at
        return forced_at > now

    def _refused_as_before(self, rank_id: str, pending: list[Program], now: float) -> bool:
        """Whether the Rank's last examination refuses every new candidate as a fresh one would: its capacity
        has not changed since (the agenda dropped it otherwise), the observation it counted as fresh still is
        (so usage and the waiting gate are the same), and each candidate is unforced with a demand above its
        ``demand_limit`` — which the count guard or the immediate token check refuses (``judge``)."""
        view = self._agenda.last_examined(rank_id)
        if view is None or self._ledger.fresh_observation(rank_id, now) is not view.observation:
            return False
        limit = -math.inf if view.gate_blocked else view.demand_limit
        queue = self._queues.get(rank_id)
        for program in pending:
            entry = None if queue is None else queue.entry(program)
            if entry is not None and (entry.forced_at <= now or entry.required <= limit):
                return False
        return True

    def cross_rank_pass(self, model_pool: str, now: float) -> None:
        """``global_queue`` pass 2: move previously paused waiters to another Rank of their pool (§3.9)."""
        config = self._config
        rank_ids = self._fleet.pool_ranks.get(model_pool, [])
        if len(rank_ids) < 2:
            return
        interval = config.metrics_interval_seconds
        stats, gate, residency = self._stats, self._gate, self._residency
        record = self._keeper.record
        mature = self._warmup.request_stats_mature  # the spec's, bar stats_warmup (variants/warmup.py)
        destinations = [t for t in rank_ids if self._queues.size(t) == 0 and mature(stats, t)]
        if not destinations:
            return
        candidates: list[Program] = []
        for rank_id in rank_ids:
            queue = self._queues.get(rank_id)
            if queue is None or not len(queue) or not mature(stats, rank_id):
                continue
            candidates.extend(
                p
                for p in queue.ordered()
                if p.last_pause_reason is not None
                and now - queued_at(record(p), now) >= interval
                and (
                    gate is None or gate.may_move(p, now - queued_at(record(p), now), now)
                )  # beyond the spec
            )
        candidates.sort(key=lambda p: cross_rank_key(p, record(p), self._request_pool.front_hints(p), now))
        views: dict[str, RankView] = {}

        def view_of(destination: str) -> RankView:
            view = views.get(destination)
            if view is None:
                view = views[destination] = self._views.of(destination, now)
            return view

        for program in candidates:
            force = record(program)
            if not forced(force, now) and not any(
                not view_of(d).gate_blocked and view_of(d).admits_some(0, 0) for d in destinations
            ):
                return  # no destination can take an unforced Program, and the forced ones came first
            source = program.last_rank
            assert source is not None
            if not _source_pressure(view_of(source), self._queues.get(source), program, record, config, now):
                continue
            if (
                residency is not None
                and not forced(force, now)
                and residency.keeps_source(program, now - queued_at(force, now))
            ):
                continue  # its Rank still holds its prefix: it resumes there cheaply
            entry = self._queues.entry(program)
            assert entry is not None
            best: tuple[tuple[int, int, float, int, str], AdmissionPlan] | None = None
            for destination in destinations:
                if destination == source or self._queues.size(destination) != 0:
                    continue
                view = view_of(destination)
                if not _headroom_allows(view_of(source), view, program, config.cross_rank_headroom_ratio):
                    continue
                result = plan(view, program, entry, now)
                if not isinstance(result, AdmissionPlan):
                    continue
                rank_key = (
                    0 if residency is None else residency.destination_order(program, destination),
                    view.waiting,
                    _pressure(config, result),
                    view.active,
                    destination,
                )
                if best is None or rank_key < best[0]:
                    best = (rank_key, result)
            if best is not None:
                self.commit_admission(program, best[1], now)
                views.pop(best[1].rank_id, None)


def _screened(
    view: RankView,
    entries: Iterable[tuple[QueueKey, int, int, float]],
    now: float,
    unforced_possible: bool,
    limit: float,
) -> Iterator[QueueKey]:
    """The keys of the candidates ``plan`` may admit, in resume order, decided from their queued facts
    alone: an unforced one ``judge`` refuses is dropped, and so is every one whose demand is above
    ``limit`` (the view's ``demand_limit``, or inf to leave that to ``judge``) unless it is forced while
    the Rank takes one past its limits; at the first unforced candidate when none can be admitted
    (``unforced_possible``, from the queue's bounds), the pass ends."""
    forced_limit = limit if view.overflow_busy else math.inf
    for key, required, uncached, forced_at in entries:
        if forced_at <= now:
            if required <= forced_limit:
                yield key
        elif not unforced_possible:
            return
        elif required <= limit and not isinstance(view.judge(required, uncached), Rejection):
            yield key


def _hopeless(view: RankView, now: float) -> Callable[[int, int, float], bool]:
    """Whether the plan admits none of a run of queued candidates, from the run's least demand, least
    uncached context and earliest force deadline: it refuses what ``judge`` refuses, and so does a forced
    candidate while the Rank holds one admitted past its limits (``FORCE_BOUND``)."""

    def hopeless(required: int, uncached: int, forced_at: float) -> bool:
        return (forced_at > now or view.overflow_busy) and not view.admits_some(required, uncached)

    return hopeless


def _pressure(config: ProgramSchedulingConfig, admission: AdmissionPlan) -> float:
    capacity = admission.capacity
    if capacity is None:
        return (admission.active + 1) / config.max_active_programs_per_target
    return (admission.used + admission.required + admission.reserve) / capacity


def _source_pressure(
    source: RankView,
    queue: RankQueue | None,
    program: Program,
    record: Callable[[Program], ForceResume | None],
    config: ProgramSchedulingConfig,
    now: float,
) -> bool:
    """The source is congested: vLLM queues there, or another long-waiting Program is ahead locally
    (``record``: the force-resume records)."""
    threshold = config.admission_waiting_request_threshold
    if threshold == 0:
        return True
    if source.waiting >= threshold:
        return True
    entry = None if queue is None else queue.entry(program)
    if queue is None or entry is None:
        return False
    key = entry.key
    interval = config.metrics_interval_seconds
    for other in queue.ordered():
        other_entry = queue.entry(other)
        if other_entry is not None and other_entry.key >= key:
            return False
        force = record(other)
        if force is not None and now - force.queued_at >= interval:
            return True
    return False


def _headroom_allows(source: RankView, destination: RankView, program: Program, ratio: float) -> bool:
    """The destination has more room below the low watermark than the source, by ``ratio`` × context."""
    low = source.low_tokens
    if low is None:
        return True
    source_free = max(0.0, low - source.used)
    destination_free = max(0.0, low - destination.used)
    return destination_free >= source_free + ratio * program.estimated_context_tokens
