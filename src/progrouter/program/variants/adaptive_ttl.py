"""The adaptive acting TTL (``acting_ttl_policy: "adaptive"``, beyond the spec): each hold decided from what
the scheduler sees now — the Rank's gap fit, the Program's cache-miss impact and context, the Rank's waiters
and force-resume deadlines — by formulas/ttl_pricing.py's rule, and decided again every
``weighed_ttl_check_seconds`` while the Program holds, up to ``max_kv_retention_ttl_seconds`` (the longest
hold an agent may ask for: the router holds no longer on its own)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from progrouter.program.formulas.ttl_pricing import adaptive_hold_seconds, hold_price
from progrouter.program.formulas.ttl_weighing import waiting_weight

if TYPE_CHECKING:
    from progrouter.config import ProgramSchedulingConfig
    from progrouter.program.core.factors import RankStats
    from progrouter.program.core.ledger import CapacityLedger
    from progrouter.program.core.queues import RankQueues
    from progrouter.program.core.state import Program
    from progrouter.program.variants.warmup import Warmup


class AdaptiveTTL:
    __slots__ = ("_config", "_ledger", "_queues", "_stats", "_warmup", "source")

    def __init__(
        self,
        config: ProgramSchedulingConfig,
        stats: RankStats,
        queues: RankQueues,
        warmup: Warmup,
        ledger: CapacityLedger,
    ) -> None:
        self._config, self._stats, self._queues, self._warmup = config, stats, queues, warmup
        self._ledger = ledger
        self.source = "fitted"

    def armed(self, program: Program, rank_id: str, impact_seconds: float) -> float:
        return self.hold(program, rank_id, 0.0)

    def hold(self, program: Program, rank_id: str, elapsed_seconds: float) -> float:
        """The rule's hold for ``program`` idle on ``rank_id`` since its last completion, up to the next
        check. The pool's share of waiters is over the Ranks the scheduler keeps statistics for."""
        config, stats = self._config, self._stats
        if stats.get(rank_id) is None:
            return 0.0
        completions = program.lifecycle.completions
        now = (completions.last_finished_at or 0.0) + elapsed_seconds
        queue = self._queues.get(rank_id)
        local = 0 if queue is None else len(queue)
        forced_at = math.inf if queue is None else queue.bounds()[2]
        held = completions.last_context_tokens
        capacity = self._ledger.capacity(rank_id)
        waiters = waiting_weight(
            local,
            self._queues.pool_waiting(program.ref.model_pool),
            len(stats),
            global_queue=config.global_queue,
        )
        hold = adaptive_hold_seconds(
            self._warmup.continuity_fit(stats, rank_id),
            program.last_cache_miss_impact_seconds,
            hold_price(waiters, held, capacity),
            elapsed_seconds,
            config.max_kv_retention_ttl_seconds,
            deadline_due=forced_at <= now,
        )
        return min(hold, config.weighed_ttl_check_seconds)
