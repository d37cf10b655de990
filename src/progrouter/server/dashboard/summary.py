"""A bounded summary of the scheduler for the dashboard and ``progrouter top``.

The full ``/scheduling/diagnostics`` renders ~40 fields for every Program of a page; pushing that every second
to a page would cost a lot of JSON per viewer. This summary renders per-Rank aggregates and one page of
Programs (a handful of fields each), so a push is small whatever the number of Programs. It reads the
scheduler only through its read-only ``SchedulerView``: building a summary touches the Ranks' Active Programs
and the RequestPool (both bounded by configuration), and a page touches its own rows (retained Programs:
the rows up to the page), never every Program.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from progrouter.program import SHOWN_STATES

if TYPE_CHECKING:
    from progrouter.program import ProgramRow, ProgramScheduler

MAX_PAGE_SIZE = 200
STATES = SHOWN_STATES


def _rank(entry: dict[str, Any]) -> dict[str, Any]:
    """The dashboard's fields of one Rank's diagnostics entry."""
    rolling = entry["rolling"]
    return {
        "target_id": entry["target_id"],
        "base_url": entry["base_url"],
        "dp_rank": entry["dp_rank"],
        "capacity_tokens": entry["token_capacity"],
        "used_tokens": entry["router_estimated_used_tokens"],
        "ledger_tokens": entry["router_ledger_tokens"],
        "vllm_used_tokens": entry["vllm_usage_scaled_tokens"],
        "vllm_kv_cache_usage": entry["vllm_kv_cache_usage"],
        "running": entry["router_active_programs"],
        "retained": entry["router_paused_reasoning_programs"] + entry["router_paused_acting_programs"],
        "pooled_programs": entry["router_queued_programs"],
        "pooled_requests": entry["router_queued_requests"],
        "queue_wait_seconds": rolling.get("avg_router_queue_seconds"),
        "cache_hit_ratio": rolling.get("avg_cached_prompt_ratio"),
        "observation_age_seconds": entry["observation_age_seconds"],
        "observation_fresh": entry["observation_fresh"],
        "accounting_source": entry["capacity_accounting_source"],
    }


def _remaining(deadline: float | None, now: float) -> float | None:
    return None if deadline is None else max(0.0, deadline - now)


def _row(row: ProgramRow, now: float) -> dict[str, Any]:
    return {
        "program": row.program,
        "state": row.state,
        "rank": row.last_rank,
        "context_tokens": row.estimated_context_tokens,
        "ttl_left_seconds": _remaining(row.ttl_deadline, now),
        "pooled_requests": row.pooled_requests,
        "age_seconds": max(0.0, now - row.created_at),
    }


class Summary:
    """One tick's view: Rank aggregates and counts (taken when built), and pages of Programs (read when
    asked for, from the live scheduler: the Programs in creation order, or those in one state)."""

    def __init__(self, scheduler: ProgramScheduler, now: float) -> None:
        view = self._view = scheduler.view
        self.now = now
        self.ranks = [_rank(entry) for entry in view.ranks(now)]
        self.programs = view.programs
        self.retained_requests = view.retained_requests
        self._counts = view.counts()

    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    def page(self, index: int, size: int, state: str | None = None) -> dict[str, Any]:
        """Rows ``index*size`` … of the Programs (in ``state`` when given), redacted ids only."""
        size = max(1, min(size, MAX_PAGE_SIZE))
        total = self.programs if state is None else self._counts[state]
        pages = max(1, -(-total // size))
        index = max(0, min(index, pages - 1))
        chosen = self._view.rows(state, index * size, (index + 1) * size)
        return {
            "index": index,
            "size": size,
            "pages": pages,
            "total": total,
            "state": state,
            "rows": [_row(row, self.now) for row in chosen],
        }
