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


class RankQueue:
    """The Paused Programs with retained requests whose last Rank is this one, in resume order.

    Besides the ordered keys it keeps a lazy min-heap of the queued Programs' demands, so a pass can tell in
    O(1) that no unforced candidate can fit and stop without planning each one.
    """

    __slots__ = ("_demand", "_keys", "_programs", "pending")

    def __init__(self) -> None:
        self._keys: list[QueueKey] = []
        self._programs: dict[int, Program] = {}  # serial -> Program
        self._demand: list[tuple[int, int, QueueKey]] = []  # (required tokens, serial, key when pushed)
        self.pending: dict[Program, None] = {}  # queued or re-keyed since the last scheduling pass

    def __len__(self) -> int:
        return len(self._keys)

    def insert(self, program: Program, key: QueueKey, required: int) -> None:
        program.queue_key = key
        program.queue_required = required
        bisect.insort(self._keys, key)
        self._programs[key[-1]] = program
        heapq.heappush(self._demand, (required, key[-1], key))
        if len(self._demand) > 2 * len(self._keys) + 32:
            self._demand = [(p.queue_required, s, p.queue_key) for s, p in self._programs.items()]  # type: ignore[misc]
            heapq.heapify(self._demand)
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

    def min_required(self) -> int | None:
        """A lower bound of the queued Programs' demands (exact unless a demand grew in place)."""
        demand = self._demand
        programs = self._programs
        while demand:
            required, serial, key = demand[0]
            program = programs.get(serial)
            if program is not None and program.queue_key == key:
                return required
            heapq.heappop(demand)
        return None

    def take_pending(self) -> list[Program]:
        pending = sorted(self.pending, key=_queue_key)
        self.pending.clear()
        return pending


def _queue_key(program: Program) -> QueueKey:
    key = program.queue_key
    assert key is not None
    return key


class RankQueues:
    """Rank queues by target id, plus which Ranks have pending (unplanned) candidates."""

    __slots__ = ("_queues", "pending_targets", "work")

    def __init__(self) -> None:
        self._queues: dict[str, RankQueue] = {}
        self.pending_targets: set[str] = set()
        self.work: dict[str, RankWork] = {}  # force-resume inputs per Rank, at most one interval old

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

    def remove(self, program: Program) -> None:
        if program.queue_key is None:
            return
        target = program.last_target
        assert target is not None
        self._queues[target].remove(program)

    def drop_target(self, target_id: str) -> list[Program]:
        """Empty a Rank's queue (it left); returns its Programs in order."""
        queue = self._queues.pop(target_id, None)
        self.pending_targets.discard(target_id)
        self.work.pop(target_id, None)
        if queue is None:
            return []
        programs = queue.ordered()
        for program in programs:
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
    core.queues.insert(program, local_key(core, program, now), required_tokens(core, program))


def requeue(core: Core, program: Program, now: float) -> None:
    """Re-insert a queued Program whose ordering or demand inputs changed (forced, front, new request)."""
    if program.queue_key is None:
        return
    core.queues.remove(program)
    core.queues.insert(program, local_key(core, program, now), required_tokens(core, program))


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
    core.timers.add(now + timeout, TimerKind.FORCE_RESUME, program)


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


def _global_estimate(core: Core, program: Program, now: float) -> ForceResumeEstimate:
    """The pool-wide version: summed throughput and work, waiters ahead weighted by their Rank's rounds."""
    maximum = core.config.force_resume_timeout_seconds
    targets = core.pool_targets.get(program.ref.model_pool, [])
    works = []
    for target in targets:
        work = _rank_work(core, target, now)
        if not work.mature:
            return ForceResumeEstimate.static(maximum)
        works.append((target, work))
    if not works:
        return ForceResumeEstimate.static(maximum)
    key = local_key(core, program, now)
    pool = 0.0
    for target, work in works:
        queue = core.queues.get(target)
        if queue is not None and len(queue):
            pool += queue.ahead_of(key) * max(work.rounds, 1)
    active = math.fsum(w.active_remaining for _, w in works)
    throughput = math.fsum(w.throughput for _, w in works)
    timeout = force_resume_timeout(active, pool, throughput, maximum)
    return ForceResumeEstimate(timeout, active, pool, throughput, False)


# ---------------------------------------------------------------------------------------------- scheduling
def schedule_target(core: Core, target_id: str, now: float, *, full: bool) -> None:
    """Admit waiters of one Rank in resume order until nobody else fits."""
    queue = core.queues.get(target_id)
    dirty = core.ledger.dirty
    while queue is not None and len(queue):
        candidates = queue.iter_ordered() if full else iter(queue.take_pending())
        queue.pending.clear()
        dirty.discard(target_id)
        view = rank_view(core, target_id, now)
        if view.gate_blocked:
            return
        unforced_possible: bool | None = None
        for program in candidates:
            if not _forced(program, now):
                if unforced_possible is None:
                    unforced_possible = view.may_admit(queue.min_required() or 0)
                if not unforced_possible:
                    return
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
    for program in candidates:
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
            view = views.get(destination)
            if view is None:
                view = views[destination] = rank_view(core, destination, now)
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
