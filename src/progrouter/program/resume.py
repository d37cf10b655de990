"""Resume: which waiting Program gets the next placement, local-first, and when waiting turns into force.

Ordering (upstream §3.8), within one Rank queue:
1. forced tier: the Program's force-resume deadline has passed;
2. larger front-request ``priority``;
3. not paused by segment yield before yielded (a one-shot marker: admission clears it);
4. ``resume_order``: ``mru`` (most recent last finish first, never-finished last, then earlier queue time)
   or ``fcfs`` (earlier queue time); then program id.
Cross-Rank candidates (``global_queue``) use tiers 1–3, then always FCFS.

Each Rank queue is a sorted list of keys, keyed by the Program's last Rank (in ``global_queue`` mode too: the
local-first pass is exactly "each Rank schedules its own waiters"). A key changes only when its inputs do
(the force deadline passes, the front request leaves), so it is re-inserted then. A scheduling pass scans a
queue in order only when the Rank's capacity state changed (``CapacityLedger.dirty``); otherwise only the
Programs queued or re-keyed since the last pass (``pending``) are planned, because every other candidate was
already refused against the very same Rank state. Scanning stops early when a refusal applies to everyone
behind (the waiting gate, the count guard for non-forced candidates).

Force resume (upstream §3.7): when a Program enters a queue its deadline is frozen at
``now + min(request deadline_seconds, else the workload estimate, queue_timeout)``; the workload estimate is
3 × (remaining rounds of the Active Programs + rounds of the waiters ahead) / request throughput, clamped to
[min(30 s, max), force_resume_timeout], and ``force_resume_timeout`` itself until the Rank's window matures.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from progrouter.config import ResumeOrder
from progrouter.program.admission import (
    AdmissionPlan,
    Rejection,
    commit_admission,
    plan,
    rank_view,
    required_tokens,
)
from progrouter.program.policy import (
    ForceResumeEstimate,
    active_remaining_rounds,
    effective_force_resume_timeout,
    force_resume_timeout,
    target_rounds,
)
from progrouter.program.state import PauseReason, QueueKey
from progrouter.program.timers import TimerKind

if TYPE_CHECKING:
    from progrouter.program.admission import RankView
    from progrouter.program.core import Core
    from progrouter.program.state import Program


class _LazyMin:
    """Min-heap of one value per queued Program, deleted lazily: an entry counts while its Program still
    sits in the queue under the key it was pushed with."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, QueueKey]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, value: int, key: QueueKey) -> None:
        heapq.heappush(self._heap, (value, key[-1], key))

    def rebuild(self, entries: list[tuple[int, int, QueueKey]]) -> None:
        heapq.heapify(entries)
        self._heap = entries

    def min(self, programs: dict[int, Program]) -> int | None:
        heap = self._heap
        while heap:
            value, serial, key = heap[0]
            program = programs.get(serial)
            if program is not None and program.queue_key == key:
                return value
            heapq.heappop(heap)
        return None


class RankQueue:
    """The Paused Programs with retained requests whose last Rank is this one, in resume order.

    Besides the ordered keys it keeps lower bounds of the queued Programs' demand and uncached context, so
    a pass can tell in O(1) that no unforced candidate can be admitted and stop without planning each one.
    """

    __slots__ = ("_demand", "_keys", "_programs", "_uncached", "pending")

    def __init__(self) -> None:
        self._keys: list[QueueKey] = []
        self._programs: dict[int, Program] = {}  # serial -> Program
        self._demand = _LazyMin()  # private tokens required
        self._uncached = _LazyMin()  # context beyond the shared prefix (what a cold start recomputes)
        self.pending: dict[Program, None] = {}  # queued or re-keyed since the last scheduling pass

    def __len__(self) -> int:
        return len(self._keys)

    def insert(self, program: Program, key: QueueKey, required: int) -> None:
        program.queue_key = key
        program.queue_required = required
        bisect.insort(self._keys, key)
        self._programs[key[-1]] = program
        self._demand.push(required, key)
        self._uncached.push(_uncached(program), key)
        if len(self._demand) > 2 * len(self._keys) + 32:
            live = [(p, p.queue_key) for p in self._programs.values()]
            self._demand.rebuild([(p.queue_required, p.serial, k) for p, k in live if k is not None])
            self._uncached.rebuild([(_uncached(p), p.serial, k) for p, k in live if k is not None])
        self.pending[program] = None

    def remove(self, program: Program) -> None:
        key = program.queue_key
        assert key is not None
        i = bisect.bisect_left(self._keys, key)
        del self._keys[i]
        del self._programs[key[-1]]
        self.pending.pop(program, None)
        program.queue_key = None

    def ahead_of(self, key: QueueKey) -> int:
        """How many queued Programs order before ``key``."""
        return bisect.bisect_left(self._keys, key)

    def ordered(self) -> list[Program]:
        programs = self._programs
        return [programs[key[-1]] for key in self._keys]

    def iter_ordered(self) -> Iterator[Program]:
        """In resume order, without copying; stop iterating once the queue changes."""
        programs = self._programs
        for key in self._keys:
            yield programs[key[-1]]

    def first(self) -> Program | None:
        return self._programs[self._keys[0][-1]] if self._keys else None

    def min_required(self) -> int:
        """A lower bound of the queued Programs' demands (0 when empty)."""
        return self._demand.min(self._programs) or 0

    def min_uncached(self) -> int:
        """A lower bound of the queued Programs' uncached contexts (0 when empty)."""
        return self._uncached.min(self._programs) or 0

    def take_pending(self) -> list[Program]:
        pending = sorted(self.pending, key=_queue_key)
        self.pending.clear()
        return pending


def _uncached(program: Program) -> int:
    return max(0, program.estimated_context_tokens - program.shared_prefix_tokens)


def _queue_key(program: Program) -> QueueKey:
    key = program.queue_key
    assert key is not None
    return key


class RankQueues:
    """Rank queues by target id, plus which Ranks have pending (unplanned) candidates."""

    __slots__ = ("_pool_keys", "_queues", "pending_targets", "pool_work", "work")

    def __init__(self, *, pool_order: bool) -> None:
        self._queues: dict[str, RankQueue] = {}
        self.pending_targets: set[str] = set()
        self.work: dict[str, RankWork] = {}  # force-resume inputs per Rank, at most one interval old
        self.pool_work: dict[str, PoolWork] = {}
        # global_queue: every waiter of a pool in one resume order, to count the waiters ahead cheaply
        self._pool_keys: dict[str, list[QueueKey]] | None = {} if pool_order else None

    def ahead_in_pool(self, model_pool: str, key: QueueKey) -> int:
        keys = None if self._pool_keys is None else self._pool_keys.get(model_pool)
        return 0 if keys is None else bisect.bisect_left(keys, key)

    def get(self, target_id: str) -> RankQueue | None:
        return self._queues.get(target_id)

    def size(self, target_id: str) -> int:
        queue = self._queues.get(target_id)
        return 0 if queue is None else len(queue)

    def insert(self, program: Program, key: QueueKey, required: int) -> None:
        target = program.last_target
        assert target is not None and program.queue_key is None
        queue = self._queues.get(target)
        if queue is None:
            queue = self._queues[target] = RankQueue()
        queue.insert(program, key, required)
        self.pending_targets.add(target)
        if self._pool_keys is not None:
            bisect.insort(self._pool_keys.setdefault(program.ref.model_pool, []), key)

    def remove(self, program: Program) -> None:
        key = program.queue_key
        if key is None:
            return
        target = program.last_target
        assert target is not None
        self._queues[target].remove(program)
        self._forget_pool_key(program, key)

    def _forget_pool_key(self, program: Program, key: QueueKey) -> None:
        if self._pool_keys is not None:
            keys = self._pool_keys[program.ref.model_pool]
            del keys[bisect.bisect_left(keys, key)]

    def drop_target(self, target_id: str) -> list[Program]:
        """Empty a Rank's queue (it left); returns its Programs in order."""
        queue = self._queues.pop(target_id, None)
        self.pending_targets.discard(target_id)
        self.work.pop(target_id, None)
        if queue is None:
            return []
        programs = queue.ordered()
        for program in programs:
            assert program.queue_key is not None
            self._forget_pool_key(program, program.queue_key)
            program.queue_key = None
        return programs


# ------------------------------------------------------------------------------------------------ ordering
def _forced(program: Program, now: float) -> bool:
    deadline = program.force_resume_deadline
    return deadline is not None and deadline <= now


def _tiers(core: Core, program: Program, now: float) -> tuple[int, int, int]:
    front = core.pool.front_hints(program)
    priority = front.priority if front is not None else 0
    yielded = 1 if program.last_pause_reason is PauseReason.MAX_SEGMENT_YIELD else 0
    return (0 if _forced(program, now) else 1, -priority, yielded)


def local_key(core: Core, program: Program, now: float) -> QueueKey:
    forced, priority, yielded = _tiers(core, program, now)
    queued = program.queued_at if program.queued_at is not None else now
    if core.config.resume_order is ResumeOrder.MRU:
        finished = program.last_request_finished_at
        recency = -finished if finished is not None else math.inf
        return (forced, priority, yielded, recency, queued, program.ref.program_id, program.serial)
    return (forced, priority, yielded, queued, 0.0, program.ref.program_id, program.serial)


def cross_rank_key(core: Core, program: Program, now: float) -> QueueKey:
    forced, priority, yielded = _tiers(core, program, now)
    queued = program.queued_at if program.queued_at is not None else now
    return (forced, priority, yielded, queued, 0.0, program.ref.program_id, program.serial)


def enqueue(core: Core, program: Program, now: float) -> None:
    """Queue a Paused Program with retained requests on its last Rank, freezing its force deadline."""
    if program.queue_key is not None or program.last_target is None:
        return
    if program.queued_at is None:
        program.queued_at = now
    if program.force_resume_deadline is None:
        _freeze_force_deadline(core, program, now)
    else:  # queued again (failover) with its deadline kept: its timer may have fired meanwhile
        core.timers.arm(program, TimerKind.FORCE_RESUME, program.force_resume_deadline)
    _insert(core, program, now)


def _insert(core: Core, program: Program, now: float) -> None:
    uncached = max(0, program.estimated_context_tokens - program.shared_prefix_tokens)
    program.queue_recovery = core.config.prefill_cost_model.cache_miss_impact_seconds(uncached)
    core.queues.insert(program, local_key(core, program, now), required_tokens(core, program))


def requeue(core: Core, program: Program, now: float) -> None:
    """Re-insert a queued Program whose ordering or demand inputs changed (forced, front, new request)."""
    if program.queue_key is None:
        return
    core.queues.remove(program)
    _insert(core, program, now)


def _freeze_force_deadline(core: Core, program: Program, now: float) -> None:
    config = core.config
    estimate = (
        _global_estimate(core, program, now) if config.global_queue else _local_estimate(core, program, now)
    )
    front = core.pool.front_hints(program)
    timeout = effective_force_resume_timeout(
        estimate.timeout_seconds,
        front.deadline_seconds if front is not None else None,
        config.queue_timeout_seconds,
    )
    program.force_resume_timeout = timeout
    program.force_resume_deadline = now + timeout
    program.force_resume_active_remaining_rounds = round(estimate.active_remaining_rounds)
    program.force_resume_pool_remaining_rounds = round(estimate.pool_remaining_rounds)
    program.force_resume_request_throughput_per_second = estimate.request_throughput_per_second
    core.timers.arm(program, TimerKind.FORCE_RESUME, now + timeout)


def on_force_timer(core: Core, program: Program, now: float) -> None:
    """A force deadline passed: the queued Program moves into the forced tier (and is planned again)."""
    deadline = program.force_resume_deadline
    if program.queue_key is None or deadline is None:
        return
    if deadline <= now:
        requeue(core, program, now)
    else:
        core.timers.arm(program, TimerKind.FORCE_RESUME, deadline)


@dataclass(frozen=True, slots=True)
class RankWork:
    """A Rank's inputs to force-resume estimates: target rounds, throughput and the Active Programs'
    remaining rounds. Recomputed at most once per metrics interval: a deadline is an estimate, and the sum
    over every Active Program of a pool is the expensive part."""

    computed_at: float
    rounds: int
    throughput: float
    active_remaining: float

    @property
    def mature(self) -> bool:
        return self.rounds > 0 and self.throughput > 0.0


def _rank_work(core: Core, target: str, now: float) -> RankWork:
    cached = core.queues.work.get(target)
    if cached is not None and 0.0 <= now - cached.computed_at < core.config.metrics_interval_seconds:
        return cached
    factors = core.factors.get(target)
    rounds = target_rounds(factors, core.config.max_segment_rounds)
    throughput = 0.0 if factors is None else factors.request_throughput_per_second()
    active = 0.0
    if rounds > 0 and throughput > 0.0:
        rank = core.table.rank(target)
        active = math.fsum(
            active_remaining_rounds(rounds, p.rounds_since_activation, reasoning=p in rank.reasoning)
            for p in rank.active()
        )
    work = core.queues.work[target] = RankWork(now, rounds, throughput, active)
    return work


def _local_estimate(core: Core, program: Program, now: float) -> ForceResumeEstimate:
    """3 × (Active Programs' remaining rounds + rounds of the waiters ahead) / throughput, clamped."""
    target = program.last_target
    assert target is not None
    maximum = core.config.force_resume_timeout_seconds
    work = _rank_work(core, target, now)
    if not work.mature:
        return ForceResumeEstimate.static(maximum)
    queue = core.queues.get(target)
    ahead = 0 if queue is None else queue.ahead_of(local_key(core, program, now))
    pool = float(ahead * max(work.rounds, 1))
    timeout = force_resume_timeout(
        work.active_remaining, pool, work.throughput, maximum, target_rounds=work.rounds
    )
    return ForceResumeEstimate(timeout, work.active_remaining, pool, work.throughput, False)


@dataclass(frozen=True, slots=True)
class PoolWork:
    """A pool's inputs to global force-resume estimates, from its Ranks' ``RankWork``."""

    computed_at: float
    targets: list[str]  # the pool's target list it was computed for (identity marks a Rank change)
    mature: bool
    active_remaining: float
    throughput: float
    mean_rounds: float  # mean over the pool's Ranks of max(target rounds, 1)


def _pool_work(core: Core, model_pool: str, now: float) -> PoolWork:
    targets = core.pool_targets.get(model_pool, [])
    cached = core.queues.pool_work.get(model_pool)
    fresh = cached is not None and 0.0 <= now - cached.computed_at < core.config.metrics_interval_seconds
    if cached is not None and fresh and cached.targets is targets:
        return cached
    works = [_rank_work(core, target, now) for target in targets]
    mature = bool(works) and all(w.mature for w in works)
    work = core.queues.pool_work[model_pool] = PoolWork(
        computed_at=now,
        targets=targets,
        mature=mature,
        active_remaining=math.fsum(w.active_remaining for w in works),
        throughput=math.fsum(w.throughput for w in works),
        mean_rounds=math.fsum(max(w.rounds, 1) for w in works) / len(works) if works else 1.0,
    )
    return work


def _global_estimate(core: Core, program: Program, now: float) -> ForceResumeEstimate:
    """The pool-wide version: summed throughput and work; each waiter ahead in the pool's resume order
    counts the pool's mean target rounds (upstream weights it by its own Rank's rounds)."""
    maximum = core.config.force_resume_timeout_seconds
    work = _pool_work(core, program.ref.model_pool, now)
    if not work.mature:
        return ForceResumeEstimate.static(maximum)
    ahead = core.queues.ahead_in_pool(program.ref.model_pool, local_key(core, program, now))
    pool = ahead * work.mean_rounds
    timeout = force_resume_timeout(work.active_remaining, pool, work.throughput, maximum)
    return ForceResumeEstimate(timeout, work.active_remaining, pool, work.throughput, False)


# ---------------------------------------------------------------------------------------------- scheduling
def schedule_target(core: Core, target_id: str, now: float, *, full: bool) -> None:
    """Admit waiters of one Rank in resume order until nobody else fits."""
    queue = core.queues.get(target_id)
    dirty = core.ledger.dirty
    while queue is not None and len(queue):
        if full:
            candidates: Iterator[Program] = queue.iter_ordered()
            queue.pending.clear()
        else:
            pending = queue.take_pending()
            if not pending:
                return
            candidates = iter(pending)
        dirty.discard(target_id)
        view = rank_view(core, target_id, now)
        if view.gate_blocked:
            return
        unforced_possible: bool | None = None
        low = view.low_tokens
        for program in candidates:
            if not _forced(program, now):
                if unforced_possible is None:
                    unforced_possible = view.may_admit(queue.min_required(), queue.min_uncached())
                if not unforced_possible:
                    return
                if low is not None and view.refuses_quickly(program.queue_required, program.queue_recovery):
                    continue  # what the plan would refuse, decided from the queued facts alone
            result = plan(core, view, program, now)
            if isinstance(result, AdmissionPlan):
                commit_admission(core, program, result, now)
                break
            if result is Rejection.COUNT and not _forced(program, now):
                return
        else:
            return
        full = True  # the commit changed the Rank: everyone is a candidate again


def cross_rank_pass(core: Core, model_pool: str, now: float) -> None:
    """``global_queue`` pass 2: move previously paused waiters to another Rank of their pool (§3.9)."""
    config = core.config
    targets = core.pool_targets.get(model_pool, [])
    if len(targets) < 2:
        return
    interval = config.metrics_interval_seconds

    def mature(target: str) -> bool:
        factors = core.factors.get(target)
        return factors is not None and factors.request_window_complete()

    destinations = [t for t in targets if core.queues.size(t) == 0 and mature(t)]
    if not destinations:
        return
    candidates: list[Program] = []
    for target in targets:
        queue = core.queues.get(target)
        if queue is None or not len(queue) or not mature(target):
            continue
        candidates.extend(
            p
            for p in queue.ordered()
            if p.last_pause_reason is not None and p.queued_at is not None and now - p.queued_at >= interval
        )
    candidates.sort(key=lambda p: cross_rank_key(core, p, now))
    views: dict[str, RankView] = {}

    def view_of(destination: str) -> RankView:
        view = views.get(destination)
        if view is None:
            view = views[destination] = rank_view(core, destination, now)
        return view

    for program in candidates:
        if not _forced(program, now) and not any(
            not view_of(d).gate_blocked and view_of(d).may_admit(0, 0) for d in destinations
        ):
            return  # no destination can take an unforced Program, and the forced ones came first
        source = program.last_target
        assert source is not None
        if not _source_pressure(core, program, source, now):
            continue
        best: tuple[tuple[int, float, int, str], AdmissionPlan] | None = None
        for destination in destinations:
            if destination == source or core.queues.size(destination) != 0:
                continue
            if not _headroom_allows(core, program, source, destination, now):
                continue
            view = view_of(destination)
            result = plan(core, view, program, now)
            if not isinstance(result, AdmissionPlan):
                continue
            rank_key = (
                _fresh_waiting(core, destination, now),
                _pressure(core, result),
                view.active,
                destination,
            )
            if best is None or rank_key < best[0]:
                best = (rank_key, result)
        if best is not None:
            commit_admission(core, program, best[1], now)
            views.pop(best[1].target_id, None)


def _fresh_waiting(core: Core, target_id: str, now: float) -> int:
    observation = core.ledger.fresh_observation(target_id, now)
    return 0 if observation is None else observation.waiting


def _pressure(core: Core, admission: AdmissionPlan) -> float:
    capacity = core.config.token_capacity_per_dp_rank
    if capacity is None:
        return (admission.active + 1) / core.config.max_active_programs_per_target
    return (admission.used + admission.required + admission.reserve) / capacity


def _source_pressure(core: Core, program: Program, source: str, now: float) -> bool:
    """The source is congested: vLLM queues there, or another long-waiting Program is ahead locally."""
    threshold = core.config.admission_waiting_request_threshold
    if threshold == 0:
        return True
    if _fresh_waiting(core, source, now) >= threshold:
        return True
    queue = core.queues.get(source)
    key = program.queue_key
    if queue is None or key is None:
        return False
    interval = core.config.metrics_interval_seconds
    for other in queue.ordered():
        if other.queue_key is not None and other.queue_key >= key:
            return False
        if other.queued_at is not None and now - other.queued_at >= interval:
            return True
    return False


def _headroom_allows(core: Core, program: Program, source: str, destination: str, now: float) -> bool:
    low = core.low_tokens
    if low is None:
        return True
    source_free = max(0.0, low - core.ledger.usage(source, now))
    destination_free = max(0.0, low - core.ledger.usage(destination, now))
    needed = source_free + core.config.cross_rank_headroom_ratio * program.estimated_context_tokens
    return destination_free >= needed
