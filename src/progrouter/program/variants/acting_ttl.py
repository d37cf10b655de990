"""The acting TTL an idle Active Program keeps its placement for, by ``acting_ttl_policy``, chosen once.

- ``spec``: the TTL fitted to the Rank's continuity window (upstream §3.10; 0 until the window is complete,
  bar ``stats_warmup``: variants/warmup.py), never extended;
- ``fixed``: ``max_acting_ttl_seconds``, never extended;
- ``weighed`` (beyond the spec, ttl_weighing.py): the hold the waiters' weight allows, checked again every
  ``weighed_ttl_check_seconds``;
- ``adaptive`` (beyond the spec, variants/adaptive_ttl.py): the same, each held second priced by the share of
  the Rank it keeps from the waiters (formulas/ttl_pricing.py).

A request's ``kv_retention_ttl_seconds`` hint overrides every policy (lifecycle's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from progrouter.config import ActingTTLPolicy
from progrouter.program.formulas import ttl_weighing
from progrouter.program.variants.adaptive_ttl import AdaptiveTTL
from progrouter.program.variants.warmup import fitted_ttl

if TYPE_CHECKING:
    from progrouter.config import ProgramSchedulingConfig
    from progrouter.program.core.factors import RankStats
    from progrouter.program.core.ledger import CapacityLedger
    from progrouter.program.core.queues import RankQueues
    from progrouter.program.core.state import Program
    from progrouter.program.variants.warmup import Warmup


class TTLPolicy(Protocol):
    @property
    def source(self) -> str: ...  # the ``armed_ttl_seconds{source}`` label

    def armed(self, program: Program, rank_id: str, impact_seconds: float) -> float:
        """The TTL an idle Program of ``rank_id`` gets as its request completes (``impact_seconds``: the
        completion's cache-miss impact)."""
        ...

    def hold(self, program: Program, rank_id: str, elapsed_seconds: float) -> float:
        """How much longer a Program whose TTL ran out after ``elapsed_seconds`` keeps it (0: pause now)."""
        ...


class SpecTTL:
    __slots__ = ("_max_ttl", "_stats", "_warmup", "source")

    def __init__(self, config: ProgramSchedulingConfig, stats: RankStats, warmup: Warmup) -> None:
        self._max_ttl, self._stats, self._warmup = config.max_acting_ttl_seconds, stats, warmup
        self.source = "fitted"

    def armed(self, program: Program, rank_id: str, impact_seconds: float) -> float:
        return fitted_ttl(self._warmup, self._stats, rank_id, impact_seconds, self._max_ttl)

    def hold(self, program: Program, rank_id: str, elapsed_seconds: float) -> float:
        return 0.0


class FixedTTL:
    __slots__ = ("_ttl", "source")

    def __init__(self, config: ProgramSchedulingConfig) -> None:
        self._ttl = config.max_acting_ttl_seconds
        self.source = "fixed"

    def armed(self, program: Program, rank_id: str, impact_seconds: float) -> float:
        return self._ttl

    def hold(self, program: Program, rank_id: str, elapsed_seconds: float) -> float:
        return 0.0


class WeighedTTL:
    __slots__ = ("_config", "_queues", "_stats", "_warmup", "source")

    def __init__(
        self, config: ProgramSchedulingConfig, stats: RankStats, queues: RankQueues, warmup: Warmup
    ) -> None:
        self._config, self._stats, self._queues, self._warmup = config, stats, queues, warmup
        self.source = "fitted"

    def armed(self, program: Program, rank_id: str, impact_seconds: float) -> float:
        return self.hold(program, rank_id, 0.0)

    def hold(self, program: Program, rank_id: str, elapsed_seconds: float) -> float:
        return ttl_weighing.hold_seconds(
            self._config, self._stats, self._queues, self._warmup, program, rank_id, elapsed_seconds
        )


def acting_ttl(
    config: ProgramSchedulingConfig,
    stats: RankStats,
    queues: RankQueues,
    warmup: Warmup,
    ledger: CapacityLedger,
) -> TTLPolicy:
    """The policy ``acting_ttl_policy`` names, on the warm-up ``stats_warmup`` names."""
    policy = config.acting_ttl_policy
    if policy is ActingTTLPolicy.ADAPTIVE:
        return AdaptiveTTL(config, stats, queues, warmup, ledger)
    if policy is ActingTTLPolicy.FIXED:
        return FixedTTL(config)
    if policy is ActingTTLPolicy.WEIGHED:
        return WeighedTTL(config, stats, queues, warmup)
    return SpecTTL(config, stats, warmup)
