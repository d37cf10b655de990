"""What one running router holds, and the app keys other modules use to reach it.

``RouterState`` is the one owner of the worker set: startup, ``/add_worker`` and ``/remove_worker`` all
change it through ``add_worker``/``remove_worker``, which keep the targets, health tracking, policy, prefix
index, Program gate and metric labels in step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from progrouter.config import RouterConfig
from progrouter.routing.kv_aware import KvAwarePolicy
from progrouter.routing.policies import RoutingPolicy, build_policy
from progrouter.routing.prefix_tree import CacheAwareIndex
from progrouter.routing.target import Target, expand_targets
from progrouter.server.gate.contract import ProgramGate
from progrouter.server.hop.health import HealthChecker, HealthTracker
from progrouter.server.prefix_index import shared_cache_index
from progrouter.server.telemetry.metrics import RouterMetrics

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
    checker: HealthChecker | None = None
    draining: bool = False  # SIGTERM received: not ready, new requests refused
    active_requests: int = 0  # requests being handled (the drain waits for 0)
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

    @property
    def kv_aware(self) -> KvAwarePolicy | None:
        """``--policy kv_aware``, whose index (its KV event subscribers fill it, one per Rank) and tokenizer
        residency-aware Program scheduling uses too; None with any other policy."""
        return self.policy if isinstance(self.policy, KvAwarePolicy) else None

    @property
    def worker_urls(self) -> list[str]:
        """Worker base URLs in the order they were added."""
        return list(self.health.healthy)

    def refresh_candidates(self) -> None:
        """Recompute the healthy targets after a health change and tell the policy and the gate."""
        before = {t.id for t in self.candidates}
        self.candidates = sorted(t for t in self.targets if self.health.healthy.get(t.base_url, False))
        removed = sorted(before - {t.id for t in self.candidates})
        if removed:
            self.policy.on_targets_removed(removed)
        for worker, ok in self.health.healthy.items():
            self.metrics.worker_healthy.labels(worker).set(1 if ok else 0)
        if self.gate is not None:
            self.gate.set_healthy_targets(self.candidates)

    def add_worker(self, url: str, *, healthy: bool = True) -> bool:
        """Add a worker (all its Ranks); False when it is already there."""
        url = url.rstrip("/")
        if url in self.health.healthy:
            return False
        added = expand_targets([url], self.config.intra_node_data_parallel_size)
        self.targets.extend(added)
        for target in added:
            self.metrics.cb_state.labels(target.id).set(0)
        self.health.add(url, healthy)
        self.refresh_candidates()
        log.info("worker %s added", url)
        return True

    def remove_worker(self, url: str) -> list[Target]:
        """Remove a worker: its Programs fail over, its prefix-tree and gauge series go; its targets
        (none when absent), whose circuit breakers the caller forgets."""
        url = url.rstrip("/")
        if url not in self.health.healthy:
            return []
        gone = [t for t in self.targets if t.base_url == url]
        self.targets = [t for t in self.targets if t.base_url != url]
        self.health.remove(url)
        self.refresh_candidates()
        if self.cache_index is not None:
            for target in gone:
                self.cache_index.remove_target(target.id)
        for label in {url, *(t.id for t in gone)}:
            self.metrics.forget_worker(label)
        log.info("worker %s removed", url)
        return gone

    def workers_answered(self, urls: list[str]) -> None:
        """The startup wait heard these workers answer: healthy now, without waiting for the threshold."""
        for url in urls:
            if url in self.health.healthy:
                self.health.add(url, True)
        self.refresh_candidates()

    def request_started(self) -> None:
        self.active_requests += 1
        self.idle.clear()

    def request_finished(self) -> None:
        self.active_requests -= 1
        if self.active_requests == 0:
            self.idle.set()


def build_state(
    config: RouterConfig, registry: CollectorRegistry, *, workers_start_healthy: bool
) -> RouterState:
    """A router's state from its config (every shell builds it so): the worker set in command-line order,
    the native policy, the shared prefix index and the metrics; the gate, session and checker come later."""
    targets = expand_targets(config.worker_urls, config.intra_node_data_parallel_size)
    cache_index = shared_cache_index(config)
    state = RouterState(
        config=config,
        targets=targets,
        policy=build_policy(config, cache_index, time.monotonic),
        metrics=RouterMetrics(registry),
        health=HealthTracker(
            list(dict.fromkeys(t.base_url for t in targets)),  # command-line order
            config.health_failure_threshold,
            config.health_success_threshold,
            initially_healthy=workers_start_healthy,
        ),
        cache_index=cache_index,
    )
    state.metrics.active_workers.set_function(lambda: len({t.base_url for t in state.candidates}))
    return state


def attach_health_checker(state: RouterState) -> HealthChecker:
    """The workers' health checker of every shell: the config's endpoint and timings, the worker key (as
    upstream sends it), and a changed verdict refreshes the candidate set."""
    config = state.config
    assert state.session is not None, "the worker session is opened before the checker"
    state.checker = HealthChecker(
        state.health,
        state.session,
        endpoint=config.health_check_endpoint,
        interval=config.health_check_interval_secs,
        timeout=config.health_check_timeout_secs,
        headers={} if config.api_key is None else {"Authorization": f"Bearer {config.api_key}"},
        on_change=state.refresh_candidates,
    )
    return state.checker


STATE_KEY = web.AppKey("progrouter_state", RouterState)
REGISTRY_KEY = web.AppKey("progrouter_registry", CollectorRegistry)
CONFIG_KEY = web.AppKey("progrouter_config", RouterConfig)
