"""What the scheduler shows: the §5.6 snapshot (on demand), gauges and accounting-source changes (on tick).

Nothing here runs on the arrival or completion path, and nothing here costs the event loop time in
proportion to the live Programs: a snapshot reads each Rank's indexes (its Active Programs, bounded by
capacity), the RequestPool (bounded by ``max_pooled_requests``) and one page of Programs, never every Program.
Paused Programs are counted, not scanned: a Rank's attributed Programs that are not Active are Paused, and a
Paused+Reasoning Program always has a request in the pool (it turns Paused+Acting when its last one leaves),
so the pool finds those. The snapshot is JSON-ready (no infinities), lists every known Rank with its
capacity, usage, accounting source and rolling statistics, and the Programs attributed to it by their last
Rank in the order they came to it, one page of them at a time (``program_page``); client-chosen ids (task,
session, agent, parent, root, request) are shown redacted. Gauges carry only target ids and bounded enums.
``SchedulerView`` is the same read-only access for the shell's summaries (the dashboard).
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from progrouter.program.core.demand import program_private_tokens
from progrouter.program.core.ledger import RankAccount
from progrouter.program.core.lifecycle import future_relief
from progrouter.program.core.rank_capacity import watermark_tokens
from progrouter.program.core.state import ProgramState, ProgramStatus
from progrouter.program.formulas.accounting import CapacityAccountingSource, observation_fresh
from progrouter.program.formulas.ttl_fit import fitted_acting_ttl_for_rank

if TYPE_CHECKING:
    from progrouter.config import ProgramSchedulingConfig
    from progrouter.program.core.factors import RankFactors, RankStats
    from progrouter.program.core.fleet import Fleet
    from progrouter.program.core.force_resume import ForceResumeKeeper
    from progrouter.program.core.ledger import CapacityLedger
    from progrouter.program.core.lineage import ProgramLineage
    from progrouter.program.core.queues import RankQueues
    from progrouter.program.core.request_pool import RequestPool
    from progrouter.program.core.state import Program
    from progrouter.program.core.table import ProgramTable
    from progrouter.program.observer import SchedulerObserver
    from progrouter.program.residency import ResidencyRules


#: Program entries one snapshot lists unless asked for fewer or more (``limit``), and the most it lists: at
#: ~1.2 KB of JSON each, a page stays well under a megabyte however many Programs are live.
DEFAULT_PROGRAM_PAGE = 500
MAX_PROGRAM_PAGE = 5000


class _Pager:
    """Which Program entries a snapshot lists: ``limit`` of them from ``offset``, over the Ranks in order."""

    __slots__ = ("limit", "offset", "seen")

    def __init__(self, offset: int, limit: int) -> None:
        self.offset, self.limit, self.seen = offset, limit, 0

    def take(self, programs: dict[Program, None]) -> list[Program]:
        """This Rank's share of the page: O(offset + limit), whatever the number of Programs."""
        start = max(0, self.offset - self.seen)
        stop = max(start, self.offset + self.limit - self.seen)
        self.seen += len(programs)
        return list(itertools.islice(programs, start, stop)) if start < len(programs) else []


def redact(value: str | None) -> str | None:
    """A client-chosen id as diagnostics show it: 16 hex digits of a stable hash (as the logs redact)."""
    if value is None:
        return None
    return hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


#: How a summary shows a Program: running (Active on a Rank), pooled (Paused with requests waiting in the
#: pool) or retained (Paused and idle).
SHOWN_STATES = ("running", "retained", "pooled")


def _remaining(deadline: float | None, now: float) -> float | None:
    return None if deadline is None else max(0.0, deadline - now)


class Diagnostics:
    """Read-only: the §5.6 snapshot, the gauges and the accounting-source log events."""

    __slots__ = (
        "_config",
        "_fleet",
        "_keeper",
        "_ledger",
        "_lineage",
        "_observer",
        "_queues",
        "_request_pool",
        "_residency",
        "_stats",
        "_table",
    )

    def __init__(
        self,
        config: ProgramSchedulingConfig,
        observer: SchedulerObserver,
        table: ProgramTable,
        request_pool: RequestPool,
        queues: RankQueues,
        ledger: CapacityLedger,
        stats: RankStats,
        fleet: Fleet,
        lineage: ProgramLineage,
        keeper: ForceResumeKeeper,
        residency: ResidencyRules | None,
    ) -> None:
        self._config = config
        self._observer = observer
        self._table = table
        self._request_pool = request_pool
        self._queues = queues
        self._ledger = ledger
        self._stats = stats
        self._fleet = fleet
        self._lineage = lineage
        self._keeper = keeper
        self._residency = residency

    def report_accounting_sources(
        self,
        changes: list[tuple[str, CapacityAccountingSource | None, CapacityAccountingSource]],
        now: float,
    ) -> None:
        """Log each change of a Rank's capacity-accounting source: WARN into a fallback, INFO on recovery."""
        ledger = self._ledger
        freshness = ledger.freshness_seconds
        for rank_id, previous, current in changes:
            if previous is None:
                continue
            age = ledger.observation_age(rank_id, now)
            if current is CapacityAccountingSource.BACKEND_OBSERVATION:
                self._observer.event(
                    "info",
                    "capacity_observation_recovered",
                    target=rank_id,
                    previous_source=previous.value,
                    source=current.value,
                    observation_age_seconds=age,
                )
            else:
                self._observer.event(
                    "warning",
                    "capacity_observation_fallback",
                    target=rank_id,
                    previous_source=previous.value,
                    source=current.value,
                    observation_age_seconds=age,
                    freshness_threshold_seconds=freshness,
                )

    def publish_gauges(self, now: float) -> None:
        observer = self._observer
        max_ttl = self._config.max_acting_ttl_seconds
        for rank_id in self._fleet.targets:
            rank = self._table.peek_rank(rank_id)
            observer.gauge("rank_queue_size", self._queues.size(rank_id), target=rank_id)
            observer.gauge("rank_active_programs", rank.active_count, target=rank_id)
            fresh = self._ledger.fresh_observation(rank_id, now) is not None
            observer.gauge("capacity_observation_fresh", 1.0 if fresh else 0.0, target=rank_id)
            observer.gauge("token_capacity_tokens", self._ledger.capacity(rank_id) or 0, target=rank_id)
            factors = self._stats.get(rank_id)
            if factors is None:
                continue
            impact = factors.average_cache_miss_impact_seconds()
            observer.gauge(
                "fitted_ttl_seconds", fitted_acting_ttl_for_rank(factors, impact, max_ttl), target=rank_id
            )
            observer.gauge("context_growth_tokens", factors.average_context_growth_tokens(), target=rank_id)
            observer.gauge("cache_miss_impact_rolling_mean_seconds", impact, target=rank_id)
            observer.gauge("rolling_samples", factors.request_sample_count, target=rank_id, window="request")
            observer.gauge(
                "rolling_samples", factors.continuity_sample_count, target=rank_id, window="continuity"
            )

    def snapshot(self, now: float, *, offset: int = 0, limit: int = DEFAULT_PROGRAM_PAGE) -> dict[str, Any]:
        """The §5.6 snapshot; Program entries are paged (``offset``/``limit`` over all Ranks' lists)."""
        config = self._config
        pager = _Pager(offset, min(limit, MAX_PROGRAM_PAGE))
        paused_reasoning = self.paused_reasoning()
        ranks = [
            self.rank_entry(rank_id, now, paused_reasoning, pager) for rank_id in sorted(self._fleet.targets)
        ]
        return {
            "enabled": True,
            "binding_only": config.binding_only,
            "global_queue": config.global_queue,
            "resume_order": config.resume_order.value,
            "binding_strategy": config.binding_strategy.value,
            "cross_rank_headroom_ratio": config.cross_rank_headroom_ratio,
            "retained_requests": len(self._request_pool),
            "programs": len(self._table),
            "model_pools": len(self._fleet.pool_ranks),
            "program_page": {"offset": offset, "limit": pager.limit, "total": pager.seen},
            "ranks": ranks,
        }

    def paused_reasoning(self) -> Counter[str]:
        """Paused+Reasoning Programs per last Rank, found through the pool (see the module docstring)."""
        counts: Counter[str] = Counter()
        for program in self._request_pool.programs():
            if program.state is ProgramState.PAUSED and program.status is ProgramStatus.REASONING:
                counts[program.last_rank or ""] += 1
        return counts

    def rank_entry(
        self, rank_id: str, now: float, paused_reasoning: Counter[str], pager: _Pager | None
    ) -> dict[str, Any]:
        """One Rank's entry; with no ``pager`` its aggregates only (no ``programs`` list)."""
        config = self._config
        target = self._fleet.targets[rank_id]
        ledger = self._ledger
        account = ledger.accounts.get(rank_id) or RankAccount()
        rank = self._table.peek_rank(rank_id)
        capacity = ledger.capacity(rank_id)
        low_tokens = watermark_tokens(capacity, config.low_watermark_ratio)
        used = ledger.usage(rank_id, now)
        observation = account.observation
        age = ledger.observation_age(rank_id, now)
        checkpoint = account.checkpoint
        native = account.native_used_tokens
        queue = self._queues.get(rank_id)
        queued = [] if queue is None else queue.ordered()
        paused = len(rank.attributed) - rank.active_count
        reasoning_paused = paused_reasoning[rank_id]
        entry: dict[str, Any] = {
            "target_id": rank_id,
            "base_url": target.base_url,
            "dp_rank": target.dp_rank,
            "configured_token_capacity": config.token_capacity_per_dp_rank,
            "token_capacity": capacity,
            "token_capacity_source": ledger.capacity_source(rank_id).value,
            "router_estimated_used_tokens": used,
            "router_estimated_headroom_tokens": None if low_tokens is None else low_tokens - used,
            "router_ledger_tokens": account.ledger_tokens,
            "vllm_usage_scaled_tokens": native,
            "observed_active_reasoning_tokens": account.est_reasoning_tokens,
            "observed_active_program_tokens": account.est_active_program_tokens,
            "tracked_active_reasoning_requests": sum(p.in_flight for p in rank.reasoning),
            "observed_router_active_reasoning_programs": None
            if checkpoint is None
            else checkpoint.active_reasoning_programs,
            "observed_router_active_reasoning_requests": None
            if checkpoint is None
            else checkpoint.active_reasoning_requests,
            "active_program_token_delta_since_observation": account.delta,
            "future_pause_relief_tokens": future_relief(rank, self._config.decode_buffer_tokens),
            "active_acting_private_tokens": ledger.charged_sum(rank.acting),
            "router_minus_vllm_used_tokens": None if native is None else used - native,
            "router_active_programs": rank.active_count,
            "router_active_reasoning_programs": len(rank.reasoning),
            "router_active_acting_programs": len(rank.acting),
            "router_paused_reasoning_programs": reasoning_paused,
            "router_paused_acting_programs": paused - reasoning_paused,
            "router_in_flight_requests": sum(p.in_flight for p in rank.active()),
            "router_queued_programs": len(queued),
            # a forced resume holds this Rank past its limits: further overdue waiters go when it leaves
            "router_forced_past_limits": rank.overflow is not None,
            "router_queued_requests": sum(self._request_pool.waiting(p) for p in queued),
            "vllm_kv_cache_usage": None if observation is None else observation.kv_cache_usage,
            "vllm_running_requests": None if observation is None else observation.running,
            "vllm_waiting_requests": None if observation is None else observation.waiting,
            "observation_age_seconds": age,
            "observation_fresh": age is not None and observation_fresh(age, config.metrics_interval_seconds),
            "capacity_accounting_source": ledger.source(rank_id, now).value,
            "rolling": self._rolling(self._stats.get(rank_id)),
        }
        if pager is not None:
            entry["programs"] = [self._program(p, now) for p in pager.take(rank.attributed)]
        return entry

    def _rolling(self, factors: RankFactors | None) -> dict[str, Any]:
        window = self._config.stats_window_size
        if factors is None:
            return {
                "request_samples": 0,
                "continuity_samples": 0,
                "ttl_pause_samples": 0,
                "request_window_complete": False,
                "continuity_window_complete": False,
                "window_size": window,
            }
        impact = factors.average_cache_miss_impact_seconds()
        return {
            "request_samples": factors.request_sample_count,
            "continuity_samples": factors.continuity_sample_count,
            "ttl_pause_samples": factors.ttl_pause_sample_count,
            "request_window_complete": factors.request_window_complete(),
            "continuity_window_complete": factors.continuity_window_complete(),
            "window_size": window,
            "avg_prompt_tokens": factors.average_prompt_tokens(),
            "avg_completion_tokens": factors.average_completion_tokens(),
            "avg_cached_prompt_tokens": factors.average_cached_prompt_tokens(),
            "avg_cached_prompt_ratio": factors.average_cached_prompt_ratio(),
            "avg_context_growth_tokens": factors.average_context_growth_tokens(),
            "avg_e2e_seconds": factors.average_e2e_seconds(),
            "avg_decode_seconds": factors.average_decode_seconds(),
            "avg_router_queue_seconds": factors.average_queue_seconds(),
            "avg_rounds_since_ttl_pause": factors.average_rounds_since_ttl_pause(),
            "avg_cache_miss_impact_seconds": impact,
            "request_throughput_per_second": factors.request_throughput_per_second(),
            "fitted_acting_ttl_seconds": fitted_acting_ttl_for_rank(
                factors, impact, self._config.max_acting_ttl_seconds
            ),
        }

    def _program(self, program: Program, now: float) -> dict[str, Any]:
        record = program.lifecycle
        identity, shared = record.identity, record.shared_prefix
        front = self._request_pool.front_hints(program)
        hints = front if front is not None else record.last_hints
        decode_buffer = self._config.decode_buffer_tokens
        force, ttl = self._keeper.record(program), record.acting_ttl
        return {
            "program": program.redacted,
            "generation": program.ref.generation,
            "state": program.state.value,
            "status": program.status.value,
            "expected_resume": identity.expected_resume,
            "task_id": redact(identity.task_id),
            "session_id": redact(identity.session_id),
            "agent_id": redact(identity.agent_id),
            "parent_program_id": redact(identity.parent_program_id),
            "root_program_id": redact(
                self._lineage.root_readonly(program.ref.model_pool, program.ref.program_id)
            ),
            "blocks_parent": identity.blocks_parent,
            "agent_role": identity.agent_role,
            "spawn_reason": identity.spawn_reason,
            "step_id": record.step_id,
            "request_id": redact(hints.request_id),
            "request_priority": hints.priority,
            "request_deadline_seconds": hints.deadline_seconds,
            "expected_output_tokens": hints.expected_output_tokens,
            "kv_retention_ttl_seconds": hints.kv_retention_ttl_seconds,
            "home_target": program.home_rank,
            "last_target": program.last_rank,
            "placement": program.placement,
            "estimated_context_tokens": program.estimated_context_tokens,
            "resident_tokens": None
            if self._residency is None
            else self._residency.diagnostic(program),  # what its Rank's KV events say it holds
            "shared_prefix_tokens": shared.tokens,
            "shared_prefix_freshness_remaining_seconds": _remaining(shared.fresh_until, now),
            "logical_tokens": program.estimated_context_tokens + decode_buffer,
            "private_tokens": program_private_tokens(program, decode_buffer),
            "charged_tokens": self._ledger.charged(program),
            "in_flight_requests": program.in_flight,
            "waiting_requests": self._request_pool.waiting(program),
            "completed_requests": record.completions.requests,
            "segment_served_rounds": record.segment.served_rounds,
            "rounds_since_activation": program.rounds_since_activation,
            "rounds_since_ttl_pause": record.segment.rounds_since_ttl_pause,
            "pause_when_idle": program.pause_when_idle,
            "pause_reason": None if program.last_pause_reason is None else program.last_pause_reason.value,
            "acting_seconds": None if ttl is None else max(0.0, now - ttl.since),
            "queued_seconds": None if force is None else max(0.0, now - force.queued_at),
            "ttl_remaining_seconds": None if ttl is None else _remaining(ttl.deadline, now),
            "force_resume_remaining_seconds": None if force is None else _remaining(force.deadline, now),
            "force_resume_timeout_seconds": None if force is None else force.timeout,
            "force_resume_active_remaining_rounds": None if force is None else force.active_remaining_rounds,
            "force_resume_pool_remaining_rounds": None if force is None else force.pool_remaining_rounds,
            "force_resume_request_throughput_per_second": None
            if force is None
            else force.request_throughput_per_second,
        }


class ProgramRow(NamedTuple):
    """One Program as a summary shows it, frozen at the moment it was read (the dashboard's row)."""

    program: str  # redacted
    state: str  # one of ``SHOWN_STATES``
    last_rank: str | None
    estimated_context_tokens: int
    ttl_deadline: float | None  # its acting TTL's deadline, while it has one
    pooled_requests: int
    created_at: float


class SchedulerView:
    """Read-only access to the scheduler's state for the shell's summaries (the dashboard): Rank aggregates,
    counts by shown state and pages of Programs, each without a scan of every Program."""

    __slots__ = ("_diagnostics", "_fleet", "_request_pool", "_table")

    def __init__(
        self, diagnostics: Diagnostics, table: ProgramTable, request_pool: RequestPool, fleet: Fleet
    ) -> None:
        self._diagnostics = diagnostics
        self._table = table
        self._request_pool = request_pool
        self._fleet = fleet

    @property
    def programs(self) -> int:
        return len(self._table)

    @property
    def retained_requests(self) -> int:
        return len(self._request_pool)

    def ranks(self, now: float) -> list[dict[str, Any]]:
        """Every known Rank's snapshot entry, without its Programs."""
        diagnostics = self._diagnostics
        paused_reasoning = diagnostics.paused_reasoning()
        return [diagnostics.rank_entry(t, now, paused_reasoning, None) for t in sorted(self._fleet.targets)]

    def _shown_state(self, program: Program) -> str:
        if program.state is ProgramState.ACTIVE:
            return "running"
        return "pooled" if self._request_pool.waiting(program) else "retained"

    def counts(self) -> dict[str, int]:
        """Programs per shown state: the running and pooled ones are listed, the rest are retained."""
        running, pooled = len(self._running()), len(self._pooled())
        return {"running": running, "retained": len(self._table) - running - pooled, "pooled": pooled}

    def _members(self, state: str | None, start: int, stop: int) -> list[Program]:
        """Programs ``start``…``stop`` of all (in creation order) or of one shown state: O(stop) at most."""
        chosen: Iterable[Program]
        if state == "running":
            chosen = self._running()
        elif state == "pooled":
            chosen = self._pooled()
        elif state == "retained":
            chosen = (p for p in self._table if self._shown_state(p) == "retained")
        else:
            chosen = self._table
        return list(itertools.islice(chosen, start, stop))

    def rows(self, state: str | None, start: int, stop: int) -> list[ProgramRow]:
        """Programs ``start``…``stop`` of all (in creation order) or of one shown state, as frozen rows
        (nothing a caller holds can change a Program): O(stop) at most."""
        return [
            ProgramRow(
                p.redacted,
                self._shown_state(p),
                p.last_rank,
                p.estimated_context_tokens,
                None if p.lifecycle.acting_ttl is None else p.lifecycle.acting_ttl.deadline,
                self._request_pool.waiting(p),
                p.created_at,
            )
            for p in self._members(state, start, stop)
        ]

    def _running(self) -> list[Program]:
        table = self._table
        return [p for t in sorted(self._fleet.targets) for p in table.peek_rank(t).active()]

    def _pooled(self) -> list[Program]:
        return [p for p in self._request_pool.programs() if p.state is ProgramState.PAUSED]
