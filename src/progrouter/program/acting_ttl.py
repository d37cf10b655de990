"""The acting TTL an idle Active Program keeps its placement for, by ``acting_ttl_policy``, chosen once.

- ``spec``: the TTL fitted to the Rank's continuity window (upstream §3.10; 0 until the window is complete,
  bar ``stats_warmup``: warmup.py), never extended;
- ``fixed``: ``max_acting_ttl_seconds``, never extended;
- ``weighed`` (beyond the spec, ttl_weighing.py): the hold the waiters' weight allows, checked again every
  ``weighed_ttl_check_seconds``;
- ``adaptive`` (beyond the spec, adaptive_ttl.py): the same, each held second priced by the share of the Rank
  it keeps from the waiters (ttl_pricing.py).

A request's ``kv_retention_ttl_seconds`` hint overrides every policy (lifecycle's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from progrouter.config import ActingTTLPolicy
from progrouter.program import ttl_weighing, warmup
from progrouter.program.adaptive_ttl import AdaptiveTTL

if TYPE_CHECKING:
    from progrouter.config import ProgramSchedulingConfig
    from progrouter.program.factors import RankStats
    from progrouter.program.ledger import CapacityLedger
    from progrouter.program.queues import RankQueues
    from progrouter.program.state import Program


class TTLPolicy(Protocol):
    @property
    def source(self) -> str: ...  # the ``armed_ttl_seconds{source}`` label

    def armed(self, program: Program, target_id: str, impact_seconds: float) -> float:
        """The TTL an idle Program of ``target_id`` gets as its request completes (``impact_seconds``: the
        completion's cache-miss impact)."""
        ...

    def hold(self, program: Program, target_id: str, elapsed_seconds: float) -> float:
        """How much longer a Program whose TTL ran out after ``elapsed_seconds`` keeps it (0: pause now)."""
        ...


class SpecTTL:
    __slots__ = ("_config", "_stats", "source")

    def __init__(self, config: ProgramSchedulingConfig, stats: RankStats) -> None:
        self._config, self._stats = config, stats
        self.source = "fitted"

    def armed(self, program: Program, target_id: str, impact_seconds: float) -> float:
        return warmup.fitted_ttl(self._config, self._stats, target_id, impact_seconds)

    def hold(self, program: Program, target_id: str, elapsed_seconds: float) -> float:
        return 0.0


class FixedTTL:
    __slots__ = ("_ttl", "source")

    def __init__(self, config: ProgramSchedulingConfig) -> None:
        self._ttl = config.max_acting_ttl_seconds
        self.source = "fixed"

    def armed(self, program: Program, target_id: str, impact_seconds: float) -> float:
        return self._ttl

    def hold(self, program: Program, target_id: str, elapsed_seconds: float) -> float:
        return 0.0


class WeighedTTL:
    __slots__ = ("_config", "_queues", "_stats", "source")

    def __init__(self, config: ProgramSchedulingConfig, stats: RankStats, queues: RankQueues) -> None:
        self._config, self._stats, self._queues = config, stats, queues
        self.source = "fitted"

    def armed(self, program: Program, target_id: str, impact_seconds: float) -> float:
        return self.hold(program, target_id, 0.0)

    def hold(self, program: Program, target_id: str, elapsed_seconds: float) -> float:
        return ttl_weighing.hold_seconds(
            self._config, self._stats, self._queues, program, target_id, elapsed_seconds
        )


def acting_ttl(
    config: ProgramSchedulingConfig, stats: RankStats, queues: RankQueues, ledger: CapacityLedger
) -> TTLPolicy:
    """The policy ``acting_ttl_policy`` names."""
    policy = config.acting_ttl_policy
    if policy is ActingTTLPolicy.ADAPTIVE:
        return AdaptiveTTL(config, stats, queues, ledger)
    if policy is ActingTTLPolicy.FIXED:
        return FixedTTL(config)
    if policy is ActingTTLPolicy.WEIGHED:
        return WeighedTTL(config, stats, queues)
    return SpecTTL(config, stats)
