"""A bounded summary of the scheduler for the dashboard and ``progrouter top``.

The full ``/scheduling/diagnostics`` renders ~40 fields for every Program; pushing that every second to a
page would cost O(Programs) JSON per viewer. This summary renders per-Rank aggregates and one page of
Programs (a handful of fields each), so a push is small whatever the number of Programs. It reads the
scheduler's state and never changes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from progrouter.program.state import ProgramState

if TYPE_CHECKING:
    from progrouter.program.core import Core
    from progrouter.program.scheduler import ProgramScheduler
    from progrouter.program.state import Program

MAX_PAGE_SIZE = 200
STATES = ("running", "retained", "pooled")


def _core(scheduler: ProgramScheduler) -> Core:
    """The scheduler's state, read-only (the dashboard's one reach into the scheduler)."""
    return scheduler._core


def shown_state(core: Core, program: Program) -> str:
    """running: Active on a Rank; pooled: Paused with requests waiting in the pool; retained: Paused, idle."""
    if program.state is ProgramState.ACTIVE:
        return "running"
    return "pooled" if core.pool.waiting(program) else "retained"


def _rank(core: Core, target_id: str, now: float) -> dict[str, Any]:
    ledger = core.ledger
    account = ledger.account(target_id)
    rank = core.table.rank(target_id)
    observation = account.observation
    age = ledger.observation_age(target_id, now)
    factors = core.factors.get(target_id)
    target = core.targets[target_id]
    queue = core.queues.get(target_id)
    queued = [] if queue is None else queue.ordered()
    return {
        "target_id": target_id,
        "base_url": target.base_url,
        "dp_rank": target.dp_rank,
        "capacity_tokens": core.config.token_capacity_per_dp_rank,
        "used_tokens": ledger.usage(target_id, now),
        "ledger_tokens": account.ledger_tokens,
        "vllm_used_tokens": account.native_used_tokens,
        "vllm_kv_cache_usage": None if observation is None else observation.kv_cache_usage,
        "running": rank.active_count,
        "retained": sum(p.state is ProgramState.PAUSED for p in rank.attributed),
        "pooled_programs": len(queued),
        "pooled_requests": sum(core.pool.waiting(p) for p in queued),
        "queue_wait_seconds": None if factors is None else factors.average_queue_seconds(),
        "cache_hit_ratio": None if factors is None else factors.average_cached_prompt_ratio(),
        "observation_age_seconds": age,
        "observation_fresh": ledger.fresh_observation(target_id, now) is not None,
        "accounting_source": ledger.source(target_id, now).value,
    }


def _remaining(deadline: float | None, now: float) -> float | None:
    return None if deadline is None else max(0.0, deadline - now)


def _row(core: Core, program: Program, now: float) -> dict[str, Any]:
    return {
        "program": program.redacted,
        "state": shown_state(core, program),
        "rank": program.last_target,
        "context_tokens": program.estimated_context_tokens,
        "ttl_left_seconds": None
        if program.acting_ttl is None
        else _remaining(program.acting_ttl.deadline, now),
        "pooled_requests": core.pool.waiting(program),
        "age_seconds": max(0.0, now - program.created_at),
    }


class Summary:
    """One tick's view: Rank aggregates, and the Programs in display order for any number of pages."""

    def __init__(self, scheduler: ProgramScheduler, now: float) -> None:
        core = self._core = _core(scheduler)
        self.now = now
        self.ranks = [_rank(core, t, now) for t in sorted(core.targets)]
        self.programs = len(core.table)
        self.retained_requests = len(core.pool)
        self._order = sorted(core.table, key=lambda p: p.redacted)
        self._by_state: dict[str, list[Program]] | None = None

    def counts(self) -> dict[str, int]:
        return {state: len(programs) for state, programs in self._states().items()}

    def page(self, index: int, size: int, state: str | None = None) -> dict[str, Any]:
        """Rows ``index*size`` … of the Programs (in ``state`` when given), redacted ids only."""
        size = max(1, min(size, MAX_PAGE_SIZE))
        programs = self._order if state is None else self._states()[state]
        pages = max(1, -(-len(programs) // size))
        index = max(0, min(index, pages - 1))
        chosen = programs[index * size : (index + 1) * size]
        return {
            "index": index,
            "size": size,
            "pages": pages,
            "total": len(programs),
            "state": state,
            "rows": [_row(self._core, p, self.now) for p in chosen],
        }

    def _states(self) -> dict[str, list[Program]]:
        if self._by_state is None:
            self._by_state = {state: [] for state in STATES}
            for program in self._order:
                self._by_state[shown_state(self._core, program)].append(program)
        return self._by_state
