"""The router's one prefix index (native cache_aware routing and Program cache_aware binding share it) and
the loop that keeps it bounded; every shell that routes (`serve`, `epp`) builds and trims it the same way.
"""

from __future__ import annotations

import asyncio
import logging

from progrouter.config import BindingStrategy, Policy, RouterConfig
from progrouter.routing.policies import cache_index_for
from progrouter.routing.prefix_tree import CacheAwareIndex

log = logging.getLogger("progrouter.router")


def shared_cache_index(config: RouterConfig) -> CacheAwareIndex | None:
    """One prefix index when native cache_aware routing or Program cache_aware binding uses it."""
    program = config.program_scheduling
    if config.policy in (Policy.CACHE_AWARE, Policy.KV_AWARE) or (
        program is not None and program.binding_strategy is BindingStrategy.CACHE_AWARE
    ):
        return cache_index_for(config)
    return None


async def evict_periodically(index: CacheAwareIndex, interval: float) -> None:
    """Upstream's eviction thread: every ``interval`` trim each target's prefix tree to ``max_tree_size``."""
    while True:
        await asyncio.sleep(interval)
        dropped = index.evict()
        if dropped:
            log.debug("prefix-tree eviction dropped %d characters", dropped)
