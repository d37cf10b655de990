"""Force resume (upstream §3.7): when a waiting Program's queue wait turns into force.

When a Program enters a queue its deadline is frozen at ``now + min(request deadline_seconds, else the
workload estimate, queue_timeout)``; the workload estimate is 3 × (remaining rounds of the Active Programs
+ rounds of the waiters ahead) / request throughput, clamped to [min(30 s, max), force_resume_timeout], and
``force_resume_timeout`` itself until the Rank's window matures. ``ForceResumeKeeper`` owns every waiting
Program's ``ForceResume`` record and arms its timer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from progrouter.program.core.records import ForceResume
from progrouter.program.core.resume_order import local_key
from progrouter.program.core.timers import FORCE_RESUME
from progrouter.program.formulas.force_resume import (
    ForceResumeEstimate,
    PoolThroughput,
    effective_force_resume_timeout,
    global_force_resume_estimate,
    local_force_resume_estimate,
    total_active_remaining_rounds,
)
from progrouter.program.formulas.growth import target_rounds

if TYPE_CHECKING:
    from progrouter.config import ProgramSchedulingConfig
    from progrouter.program.core.factors import RankStats
    from progrouter.program.core.fleet import Fleet
    from progrouter.program.core.queues import RankQueues
    from progrouter.program.core.records import QueueKey
    from progrouter.program.core.state import Program
    from progrouter.program.core.table import ProgramTable
    from progrouter.program.core.timers import Timers
    from progrouter.program.types import RequestHints


@dataclass(frozen=True, slots=True)
class RankWork:
    """A Rank's inputs to force-resume estimates: target rounds, throughput and the Active Programs'
    remaining rounds."""

    computed_at: float
    rounds: int
    throughput: float
    active_remaining: float


@dataclass(frozen=True, slots=True)
class PoolWork:
    """A pool's Ranks' ``RankWork`` summed, for global estimates."""

    computed_at: float
    rank_ids: list[str]  # the pool's Rank list it was computed for (identity marks a Rank change)
    throughput: PoolThroughput
    active_remaining: float


class ForceResumeKeeper:
    """Freezes the force-resume deadline of a Program entering its queue and arms its timer. The workload
    inputs of the estimates are recomputed at most once per metrics interval: a deadline is an estimate,
    and the sum over every Active Program of a pool is the expensive part. The formulas are policy's
    ``local_force_resume_estimate`` / ``global_force_resume_estimate``."""

    __slots__ = (
        "_config",
        "_fleet",
        "_pools",
        "_queues",
        "_ranks",
        "_records",
        "_stats",
        "_table",
        "_timers",
    )

    def __init__(
        self,
        config: ProgramSchedulingConfig,
        table: ProgramTable,
        stats: RankStats,
        queues: RankQueues,
        timers: Timers,
        fleet: Fleet,
    ) -> None:
        self._config = config
        self._table = table
        self._stats = stats
        self._queues = queues
        self._timers = timers
        self._fleet = fleet
        self._ranks: dict[str, RankWork] = {}
        self._pools: dict[str, PoolWork] = {}
        self._records: dict[Program, ForceResume] = {}  # every waiting Program's: this keeper's own table

    def forget(self, rank_id: str) -> None:
        self._ranks.pop(rank_id, None)

    def freeze(self, program: Program, front: RequestHints | None, now: float) -> QueueKey | None:
        """Freeze the deadline of a Program entering its queue; returns its queue key, unless the deadline
        froze already passed (which moves it to the forced tier: the key changes)."""
        config = self._config
        key = local_key(program, None, front, config.resume_order, now)  # unforced: no record yet
        estimate = self.estimate(program, key, now)
        timeout = effective_force_resume_timeout(
            estimate.timeout_seconds,
            front.deadline_seconds if front is not None else None,
            config.queue_timeout_seconds,
        )
        deadline = now + timeout
        self._records[program] = ForceResume(  # queued at, deadline, timeout, and the estimate's inputs
            now,
            deadline,
            timeout,
            round(estimate.active_remaining_rounds),
            round(estimate.pool_remaining_rounds),
            estimate.request_throughput_per_second,
        )
        self._timers.arm(program, FORCE_RESUME, deadline)
        return key if deadline > now else None

    def record(self, program: Program) -> ForceResume | None:
        """``program``'s force-resume record while it waits (kept across a failover), else None."""
        return self._records.get(program)

    def clear(self, program: Program) -> None:
        """Its wait ended (admitted, nothing left to wait for, released): the record goes whole."""
        self._records.pop(program, None)

    def rearm(self, program: Program, force: ForceResume) -> None:
        """Queued again (failover) with its deadline kept: its timer may have fired meanwhile."""
        self._timers.arm(program, FORCE_RESUME, force.deadline)

    def estimate(self, program: Program, key: QueueKey, now: float) -> ForceResumeEstimate:
        """The workload estimate for ``program`` entering its queue now under ``key``."""
        maximum = self._config.force_resume_timeout_seconds
        if self._config.global_queue:
            pool = self._pool(program.ref.model_pool, now)
            ahead = self._queues.ahead_in_pool(program.ref.model_pool, key)
            return global_force_resume_estimate(
                pool=pool.throughput,
                active_remaining_rounds=pool.active_remaining,
                waiters_ahead=ahead,
                max_timeout=maximum,
            )
        rank_id = program.last_rank
        assert rank_id is not None
        work = self._rank(rank_id, now)
        queue = self._queues.get(rank_id)
        ahead = 0 if queue is None else queue.ahead_of(key)
        return local_force_resume_estimate(
            target_rounds=work.rounds,
            throughput=work.throughput,
            active_remaining_rounds=work.active_remaining,
            waiters_ahead=ahead,
            max_timeout=maximum,
        )

    def _rank(self, rank_id: str, now: float) -> RankWork:
        cached = self._ranks.get(rank_id)
        if cached is not None and 0.0 <= now - cached.computed_at < self._config.metrics_interval_seconds:
            return cached
        factors = self._stats.get(rank_id)
        rounds = target_rounds(factors, self._config.max_segment_rounds)
        throughput = 0.0 if factors is None else factors.request_throughput_per_second()
        active = 0.0
        if rounds > 0 and throughput > 0.0:
            rank = self._table.ranks[rank_id]
            active = total_active_remaining_rounds(
                rounds,
                [p.rounds_since_activation for p in rank.reasoning],
                [p.rounds_since_activation for p in rank.acting],
            )
        work = self._ranks[rank_id] = RankWork(now, rounds, throughput, active)
        return work

    def _pool(self, model_pool: str, now: float) -> PoolWork:
        rank_ids = self._fleet.pool_ranks.get(model_pool, [])
        cached = self._pools.get(model_pool)
        fresh = cached is not None and 0.0 <= now - cached.computed_at < self._config.metrics_interval_seconds
        if cached is not None and fresh and cached.rank_ids is rank_ids:
            return cached
        works = [self._rank(rank_id, now) for rank_id in rank_ids]
        work = self._pools[model_pool] = PoolWork(
            computed_at=now,
            rank_ids=rank_ids,
            throughput=PoolThroughput.of((w.rounds, w.throughput) for w in works),
            active_remaining=math.fsum(w.active_remaining for w in works),
        )
        return work
