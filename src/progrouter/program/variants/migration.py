"""When a cross-Rank resume pays (beyond the spec; ``cross_rank_gate: "recompute_cost"``).

The spec moves a waiting Program to another Rank once it has waited one metrics interval and the capacity
gates pass. A move recomputes the whole context on the destination, so with 100k-token contexts it
throws away KV that may still sit on the source and costs tens of seconds of prefill there. The
recompute-cost gate moves a waiter only when that loss is already sunk or smaller than the wait:

- it has been paused for at least one KV turnover of its source Rank (the time that Rank's uncached
  prefill traffic takes to rewrite its whole KV): its KV there is probably gone, moving loses nothing; or
- it has waited at least its cache-miss impact (what recomputing it costs): waiting longer costs more than
  the move.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from progrouter.program.formulas.freshness import shared_prefix_freshness_seconds

if TYPE_CHECKING:
    from progrouter.config import ProgramSchedulingConfig
    from progrouter.program.core.factors import RankStats
    from progrouter.program.core.ledger import CapacityLedger
    from progrouter.program.core.state import Program
    from progrouter.program.core.table import ProgramTable


def move_pays(
    *, waited_seconds: float, paused_seconds: float, recompute_seconds: float, turnover_seconds: float
) -> bool:
    """The recompute-cost gate: the source's KV is probably gone, or the wait already exceeds the miss."""
    return paused_seconds >= turnover_seconds or waited_seconds >= recompute_seconds


def kv_turnover_seconds(
    config: ProgramSchedulingConfig,
    stats: RankStats,
    table: ProgramTable,
    rank_id: str,
    capacity: int | None,
) -> float:
    """One KV turnover of a Rank: capacity × mean e2e / Reasoning Programs / mean uncached prompt (the
    shared-prefix freshness of §3.15 with one turnover; its warm-up value before the window is mature).
    ``capacity``: the Rank's token capacity in force."""
    factors = stats.get(rank_id)
    if factors is None:
        return config.shared_prefix_freshness_warmup_seconds
    return shared_prefix_freshness_seconds(
        config.shared_prefix_freshness_warmup_seconds,
        1.0,
        capacity,
        factors.average_e2e_seconds(),
        len(table.ranks[rank_id].reasoning),
        factors.average_uncached_prompt_tokens(),
        factors.request_window_complete(),
    )


class RecomputeCostGate:
    """``cross_rank_gate: "recompute_cost"``: a waiter moves only when its KV on the source is probably
    gone or its wait already exceeds the recompute (``move_pays``). Under the spec's gate the cross-Rank
    pass asks no gate at all."""

    __slots__ = ("_config", "_ledger", "_stats", "_table")

    def __init__(
        self, config: ProgramSchedulingConfig, stats: RankStats, table: ProgramTable, ledger: CapacityLedger
    ) -> None:
        self._config, self._stats, self._table, self._ledger = config, stats, table, ledger

    def may_move(self, program: Program, waited_seconds: float, now: float) -> bool:
        """Whether the cross-Rank pass may consider ``program``."""
        return may_move(self._config, self._stats, self._table, self._ledger, program, waited_seconds, now)


def may_move(
    config: ProgramSchedulingConfig,
    stats: RankStats,
    table: ProgramTable,
    ledger: CapacityLedger,
    program: Program,
    waited_seconds: float,
    now: float,
) -> bool:
    """The recompute-cost gate's decision for ``program``."""
    source, pause = program.last_rank, program.lifecycle.pause
    if source is None or pause is None:
        return True
    return move_pays(
        waited_seconds=waited_seconds,
        paused_seconds=now - pause.at,
        recompute_seconds=program.last_cache_miss_impact_seconds,
        turnover_seconds=kv_turnover_seconds(config, stats, table, source, ledger.capacity(source)),
    )
