"""What one running router holds, and the app keys other modules use to reach it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from progrouter.config import RouterConfig
from progrouter.routing.policies import RoutingPolicy
from progrouter.routing.prefix_tree import CacheAwareIndex
from progrouter.routing.target import Target
from progrouter.server.gate import ProgramGate
from progrouter.server.health import HealthTracker
from progrouter.server.metrics import RouterMetrics

log = logging.getLogger("progrouter.router")


@dataclass(eq=False)
class RouterState:
    config: RouterConfig
    targets: list[Target]
    policy: RoutingPolicy
    metrics: RouterMetrics
    health: HealthTracker
    cache_index: CacheAwareIndex | None
    candidates: list[Target] = field(default_factory=list)  # healthy targets, sorted by id
    session: aiohttp.ClientSession | None = None
    gate: ProgramGate | None = None

    def refresh_candidates(self) -> None:
        """Recompute the healthy targets after a health change and tell the policy and the gate."""
        before = {t.id for t in self.candidates}
        self.candidates = sorted(t for t in self.targets if self.health.healthy[t.base_url])
        removed = sorted(before - {t.id for t in self.candidates})
        if removed:
            self.policy.on_targets_removed(removed)
        for worker, ok in self.health.healthy.items():
            self.metrics.worker_healthy.labels(worker).set(1 if ok else 0)
        if self.gate is not None:
            self.gate.set_healthy_targets(self.candidates)


STATE_KEY = web.AppKey("progrouter_state", RouterState)
REGISTRY_KEY = web.AppKey("progrouter_registry", CollectorRegistry)
CONFIG_KEY = web.AppKey("progrouter_config", RouterConfig)
