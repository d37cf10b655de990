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
from typing import TYPE_CHECKING, Any

from progrouter.program import residency
from progrouter.program.ledger import RankAccount, program_private_tokens
from progrouter.program.lifecycle import future_relief
from progrouter.program.policy import CapacityAccountingSource, fitted_acting_ttl_for_rank, observation_fresh
from progrouter.program.state import ProgramState, ProgramStatus

if TYPE_CHECKING:
    from progrouter.program.core import Core
    from progrouter.program.factors import RankFactors
    from progrouter.program.state import Program


def report_accounting_sources(
    core: Core,
    changes: list[tuple[str, CapacityAccountingSource | None, CapacityAccountingSource]],
    now: float,
) -> None:
    """Log each change of a Rank's capacity-accounting source: WARN into a fallback, INFO on recovery."""
    ledger = core.ledger
    freshness = ledger.freshness_seconds
    for target_id, previous, current in changes:
        if previous is None:
            continue
        age = ledger.observation_age(target_id, now)
        if current is CapacityAccountingSource.BACKEND_OBSERVATION:
            core.observer.event(
                "info",
                "capacity_observation_recovered",
                target=target_id,
                previous_source=previous.value,
                source=current.value,
                observation_age_seconds=age,
            )
        else:
            core.observer.event(
                "warning",
                "capacity_observation_fallback",
                target=target_id,
                previous_source=previous.value,
                source=current.value,
                observation_age_seconds=age,
                freshness_threshold_seconds=freshness,
            )


def publish_gauges(core: Core, now: float) -> None:
    observer = core.observer
    max_ttl = core.config.max_acting_ttl_seconds
    for target_id in core.targets:
        rank = core.table.peek_rank(target_id)
        observer.gauge("rank_queue_size", core.queues.size(target_id), target=target_id)
        observer.gauge("rank_active_programs", rank.active_count, target=target_id)
        fresh = core.ledger.fresh_observation(target_id, now) is not None
        observer.gauge("capacity_observation_fresh", 1.0 if fresh else 0.0, target=target_id)
        factors = core.factors.get(target_id)
        if factors is None:
            continue
        impact = factors.average_cache_miss_impact_seconds()
        observer.gauge(
            "fitted_ttl_seconds", fitted_acting_ttl_for_rank(factors, impact, max_ttl), target=target_id
        )
        observer.gauge("context_growth_tokens", factors.average_context_growth_tokens(), target=target_id)
        observer.gauge("cache_miss_impact_rolling_mean_seconds", impact, target=target_id)
        observer.gauge("rolling_samples", factors.request_sample_count, target=target_id, window="request")
        observer.gauge(
            "rolling_samples", factors.continuity_sample_count, target=target_id, window="continuity"
        )


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


def snapshot(core: Core, now: float, *, offset: int = 0, limit: int = DEFAULT_PROGRAM_PAGE) -> dict[str, Any]:
    """The §5.6 snapshot; Program entries are paged (``offset``/``limit`` over all Ranks' lists)."""
    config = core.config
    pager = _Pager(offset, min(limit, MAX_PROGRAM_PAGE))
    paused_reasoning = _paused_reasoning(core)
    ranks = [_rank(core, target_id, now, paused_reasoning, pager) for target_id in sorted(core.targets)]
    return {
        "enabled": True,
        "binding_only": config.binding_only,
        "global_queue": config.global_queue,
        "resume_order": config.resume_order.value,
        "binding_strategy": config.binding_strategy.value,
        "cross_rank_headroom_ratio": config.cross_rank_headroom_ratio,
        "retained_requests": len(core.pool),
        "programs": len(core.table),
        "model_pools": len(core.pool_targets),
        "program_page": {"offset": offset, "limit": pager.limit, "total": pager.seen},
        "ranks": ranks,
    }


def _paused_reasoning(core: Core) -> Counter[str]:
    """Paused+Reasoning Programs per last Rank, found through the pool (see the module docstring)."""
    counts: Counter[str] = Counter()
    for program in core.pool.programs():
        if program.state is ProgramState.PAUSED and program.status is ProgramStatus.REASONING:
            counts[program.last_target or ""] += 1
    return counts


def _rank(
    core: Core, target_id: str, now: float, paused_reasoning: Counter[str], pager: _Pager | None
) -> dict[str, Any]:
    """One Rank's entry; with no ``pager`` its aggregates only (no ``programs`` list)."""
    config = core.config
    target = core.targets[target_id]
    ledger = core.ledger
    account = ledger.accounts.get(target_id) or RankAccount()
    rank = core.table.peek_rank(target_id)
    capacity = config.token_capacity_per_dp_rank
    used = ledger.usage(target_id, now)
    observation = account.observation
    age = ledger.observation_age(target_id, now)
    checkpoint = account.checkpoint
    native = account.native_used_tokens
    queue = core.queues.get(target_id)
    queued = [] if queue is None else queue.ordered()
    paused = len(rank.attributed) - rank.active_count
    reasoning_paused = paused_reasoning[target_id]
    entry: dict[str, Any] = {
        "target_id": target_id,
        "base_url": target.base_url,
        "dp_rank": target.dp_rank,
        "configured_token_capacity": capacity,
        "router_estimated_used_tokens": used,
        "router_estimated_headroom_tokens": None if core.low_tokens is None else core.low_tokens - used,
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
        "future_pause_relief_tokens": future_relief(rank, core.config.decode_buffer_tokens),
        "active_acting_private_tokens": sum(p.charged_tokens for p in rank.acting),
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
        "router_queued_requests": sum(core.pool.waiting(p) for p in queued),
        "vllm_kv_cache_usage": None if observation is None else observation.kv_cache_usage,
        "vllm_running_requests": None if observation is None else observation.running,
        "vllm_waiting_requests": None if observation is None else observation.waiting,
        "observation_age_seconds": age,
        "observation_fresh": age is not None and observation_fresh(age, config.metrics_interval_seconds),
        "capacity_accounting_source": ledger.source(target_id, now).value,
        "rolling": _rolling(core, core.factors.get(target_id)),
    }
    if pager is not None:
        entry["programs"] = [_program(core, p, now) for p in pager.take(rank.attributed)]
    return entry


#: How a summary shows a Program: running (Active on a Rank), pooled (Paused with requests waiting in the
#: pool) or retained (Paused and idle).
SHOWN_STATES = ("running", "retained", "pooled")


class SchedulerView:
    """Read-only access to the scheduler's state for the shell's summaries (the dashboard): Rank aggregates,
    counts by shown state and pages of Programs, each without a scan of every Program."""

    __slots__ = ("_core",)

    def __init__(self, core: Core) -> None:
        self._core = core

    @property
    def programs(self) -> int:
        return len(self._core.table)

    @property
    def retained_requests(self) -> int:
        return len(self._core.pool)

    def ranks(self, now: float) -> list[dict[str, Any]]:
        """Every known Rank's snapshot entry, without its Programs."""
        core = self._core
        paused_reasoning = _paused_reasoning(core)
        return [_rank(core, t, now, paused_reasoning, None) for t in sorted(core.targets)]

    def waiting(self, program: Program) -> int:
        """Requests of ``program`` waiting in the pool."""
        return self._core.pool.waiting(program)

    def shown_state(self, program: Program) -> str:
        if program.state is ProgramState.ACTIVE:
            return "running"
        return "pooled" if self._core.pool.waiting(program) else "retained"

    def counts(self) -> dict[str, int]:
        """Programs per shown state: the running and pooled ones are listed, the rest are retained."""
        running, pooled = len(self._running()), len(self._pooled())
        return {"running": running, "retained": len(self._core.table) - running - pooled, "pooled": pooled}

    def members(self, state: str | None, start: int, stop: int) -> list[Program]:
        """Programs ``start``…``stop`` of all (in creation order) or of one shown state: O(stop) at most."""
        chosen: Iterable[Program]
        if state == "running":
            chosen = self._running()
        elif state == "pooled":
            chosen = self._pooled()
        elif state == "retained":
            chosen = (p for p in self._core.table if self.shown_state(p) == "retained")
        else:
            chosen = self._core.table
        return list(itertools.islice(chosen, start, stop))

    def _running(self) -> list[Program]:
        core = self._core
        return [p for t in sorted(core.targets) for p in core.table.peek_rank(t).active()]

    def _pooled(self) -> list[Program]:
        return [p for p in self._core.pool.programs() if p.state is ProgramState.PAUSED]


def _rolling(core: Core, factors: RankFactors | None) -> dict[str, Any]:
    window = core.config.stats_window_size
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
            factors, impact, core.config.max_acting_ttl_seconds
        ),
    }


def _remaining(deadline: float | None, now: float) -> float | None:
    return None if deadline is None else max(0.0, deadline - now)


def _program(core: Core, program: Program, now: float) -> dict[str, Any]:
    identity = program.identity
    front = core.pool.front_hints(program)
    hints = front if front is not None else program.last_hints
    decode_buffer = core.config.decode_buffer_tokens
    force, ttl = program.force_resume, program.acting_ttl
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
        "root_program_id": redact(core.lineage.root_readonly(program.ref.model_pool, program.ref.program_id)),
        "blocks_parent": identity.blocks_parent,
        "agent_role": identity.agent_role,
        "spawn_reason": identity.spawn_reason,
        "step_id": program.step_id,
        "request_id": redact(hints.request_id),
        "request_priority": hints.priority,
        "request_deadline_seconds": hints.deadline_seconds,
        "expected_output_tokens": hints.expected_output_tokens,
        "kv_retention_ttl_seconds": hints.kv_retention_ttl_seconds,
        "home_target": program.home_target,
        "last_target": program.last_target,
        "placement": program.placement,
        "estimated_context_tokens": program.estimated_context_tokens,
        "resident_tokens": residency.diagnostic(core, program),  # what its Rank's KV events say it holds
        "shared_prefix_tokens": program.shared_prefix.tokens,
        "shared_prefix_freshness_remaining_seconds": _remaining(program.shared_prefix.fresh_until, now),
        "logical_tokens": program.estimated_context_tokens + decode_buffer,
        "private_tokens": program_private_tokens(program, decode_buffer),
        "charged_tokens": program.charged_tokens,
        "in_flight_requests": program.in_flight,
        "waiting_requests": core.pool.waiting(program),
        "completed_requests": program.completions.requests,
        "segment_served_rounds": program.segment.served_rounds,
        "rounds_since_activation": program.rounds_since_activation,
        "rounds_since_ttl_pause": program.segment.rounds_since_ttl_pause,
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
