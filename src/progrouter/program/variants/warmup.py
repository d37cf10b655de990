"""A Rank's statistics before its own windows are complete (beyond the spec; ``stats_warmup: "pool"``).

The spec's automatic decisions wait for ``stats_window_size`` (100) samples per Rank: the acting TTL is 0
— pause the moment a request ends — until the Rank's continuity window is complete, and the cross-Rank
pass moves nobody to or from a Rank whose request window is not. Each Rank fills its windows at its own
request rate, so a larger fleet at the same load per Rank waits just as long. Until then every Program
gives its KV up the moment its request ends and recomputes its context after a short tool call, and
Programs that consistent hashing piled onto one Rank wait there while another idles (what it costs:
docs/benchmarks/scheduler-switches.md).

A tool call's length is the agent's, not the Rank's, and every Rank of a model pool serves the same
agents. With ``"pool"`` a Rank whose own window is incomplete borrows every Rank's samples together once
they number ``stats_window_size``: the TTL fits their intervals (the spec's log-normal, pooled exactly from
the Ranks' fits: sample counts, means and second moments, one pass over the Ranks), and the cross-Rank pass
counts the Rank as mature. A Rank with complete windows uses its own, as in the spec; the growth reserve,
target rounds and force-resume deadlines keep the spec's per-Rank warm-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from progrouter.config import StatsWarmup
from progrouter.program.core.factors import LogNormalFit
from progrouter.program.formulas.ttl_fit import fitted_acting_ttl_from_fit, pooled_fit

if TYPE_CHECKING:
    from progrouter.config import ProgramSchedulingConfig
    from progrouter.program.core.factors import RankFactors, RankStats


class Warmup(Protocol):
    """What a Rank's statistics may decide before its own windows are complete."""

    def continuity_fit(self, stats: RankStats, rank_id: str) -> LogNormalFit | None:
        """The interval fit the acting TTL of ``rank_id`` may use now, None while it must be 0."""
        ...

    def request_stats_mature(self, stats: RankStats, rank_id: str) -> bool:
        """Whether the cross-Rank pass may move Programs to or from ``rank_id``."""
        ...


class SpecWarmup:
    """The spec's: a Rank's own windows, once complete."""

    __slots__ = ()

    def continuity_fit(self, stats: RankStats, rank_id: str) -> LogNormalFit | None:
        factors: RankFactors | None = stats.get(rank_id)
        if factors is not None and factors.continuity_window_complete():
            return factors.log_normal_fit()
        return None

    def request_stats_mature(self, stats: RankStats, rank_id: str) -> bool:
        factors = stats.get(rank_id)
        return factors is not None and factors.request_window_complete()


class PooledWarmup:
    """``"pool"``: a Rank whose own window is incomplete borrows every Rank's samples once they fill one."""

    __slots__ = ("_own", "_window")

    def __init__(self, window: int) -> None:
        self._own, self._window = SpecWarmup(), window

    def continuity_fit(self, stats: RankStats, rank_id: str) -> LogNormalFit | None:
        own = self._own.continuity_fit(stats, rank_id)
        if own is not None:
            return own
        every = stats.values()
        if sum(f.continuity_sample_count for f in every) < self._window:
            return None
        return pooled_fit(f.log_normal_fit() for f in every)

    def request_stats_mature(self, stats: RankStats, rank_id: str) -> bool:
        if stats.get(rank_id) is None:
            return False
        if self._own.request_stats_mature(stats, rank_id):
            return True
        return sum(f.request_sample_count for f in stats.values()) >= self._window


def stats_warmup(config: ProgramSchedulingConfig) -> Warmup:
    """The warm-up ``stats_warmup`` names."""
    if config.stats_warmup is StatsWarmup.POOL:
        return PooledWarmup(config.stats_window_size)
    return SpecWarmup()


def fitted_ttl(
    warmup: Warmup, stats: RankStats, rank_id: str, impact_seconds: float, max_ttl_seconds: float
) -> float:
    """The spec's fitted acting TTL for a request that completed on ``rank_id``, from ``warmup``'s
    continuity fit (the spec's value exactly under ``SpecWarmup``)."""
    fit = warmup.continuity_fit(stats, rank_id)
    return fitted_acting_ttl_from_fit(fit, impact_seconds, max_ttl_seconds, window_complete=fit is not None)
