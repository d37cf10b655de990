"""Native request-level routing policies (``--policy``) for requests without Program identity.

Every policy answers ``select(candidates, request)`` over the healthy targets (sorted by id, never empty)
and hears ``on_start``/``on_finish`` for each forwarded request, so in-flight load is known to the ones
that balance on it. Policies are plain objects: no I/O, called from the event loop only.
"""

from __future__ import annotations

import os
import random
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from progrouter.config import Policy as PolicyName
from progrouter.config import RouterConfig
from progrouter.routing.hash_key import body_hash_key, header_hash_key, native_hash_key
from progrouter.routing.hash_ring import HashRing, stable_hash64
from progrouter.routing.prefix_tree import CacheAwareIndex
from progrouter.routing.request_text import routing_text
from progrouter.routing.target import Target

NATIVE_HASH_VIRTUAL_NODES = 160


@dataclass(frozen=True, slots=True)
class RoutingRequest:
    """What a policy may look at. ``body`` is the parsed JSON object, or None when unparsed or not JSON."""

    headers: Mapping[str, str]
    body: Mapping[str, Any] | None
    raw_body: bytes


class RoutingPolicy:
    """Base: tracks in-flight requests per target id; subclasses choose."""

    name: str = ""
    needs_body: bool = False  # whether select() reads the parsed body
    prepares: bool = False  # whether ``prepare`` must be awaited before select()

    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}
        self.last_decision = ""  # why the last select() chose as it did (cache_aware only), for metrics

    async def prepare(self, request: RoutingRequest) -> None:
        """Work select() needs that is too slow for the event loop (kv_aware tokenizing a long prompt)."""

    def select(self, candidates: Sequence[Target], request: RoutingRequest) -> Target:
        raise NotImplementedError

    def on_start(self, target: Target) -> None:
        self.in_flight[target.id] = self.in_flight.get(target.id, 0) + 1

    def on_finish(self, target: Target) -> None:
        left = self.in_flight.get(target.id, 0) - 1
        if left > 0:
            self.in_flight[target.id] = left
        else:
            self.in_flight.pop(target.id, None)

    def on_targets_removed(self, target_ids: Sequence[str]) -> None:
        """Targets left the candidate set (unhealthy); forget state that would mislead later choices."""


class RandomPolicy(RoutingPolicy):
    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        super().__init__()
        self._rng = random.Random(seed)

    def select(self, candidates: Sequence[Target], request: RoutingRequest) -> Target:
        return candidates[self._rng.randrange(len(candidates))]


class RoundRobinPolicy(RoutingPolicy):
    name = "round_robin"

    def __init__(self) -> None:
        super().__init__()
        self._counter = 0

    def select(self, candidates: Sequence[Target], request: RoutingRequest) -> Target:
        target = candidates[self._counter % len(candidates)]
        self._counter += 1
        return target


class ConsistentHashPolicy(RoutingPolicy):
    """Sticky by session header / body field / body hash; the ring follows the candidate set."""

    name = "consistent_hash"
    needs_body = True

    def __init__(self, virtual_nodes: int = NATIVE_HASH_VIRTUAL_NODES) -> None:
        super().__init__()
        self._virtual_nodes = virtual_nodes
        self._ring_ids: tuple[str, ...] = ()
        self._ring: HashRing | None = None
        self._by_id: dict[str, Target] = {}

    def select(self, candidates: Sequence[Target], request: RoutingRequest) -> Target:
        ids = tuple(t.id for t in candidates)
        if self._ring is None or ids != self._ring_ids:
            self._ring, self._ring_ids = HashRing(ids, self._virtual_nodes), ids
            self._by_id = {t.id: t for t in candidates}
        key = native_hash_key(request.headers, request.body, request.raw_body)
        return self._by_id[self._ring.lookup(key)]


class PowerOfTwoPolicy(RoutingPolicy):
    """Two distinct random candidates; the one with fewer in-flight requests wins."""

    name = "power_of_two"

    def __init__(self, seed: int | None = None) -> None:
        super().__init__()
        self._rng = random.Random(seed)

    def select(self, candidates: Sequence[Target], request: RoutingRequest) -> Target:
        if len(candidates) == 1:
            return candidates[0]
        a, b = self._rng.sample(range(len(candidates)), 2)
        ta, tb = candidates[a], candidates[b]
        return tb if self.in_flight.get(tb.id, 0) < self.in_flight.get(ta.id, 0) else ta


class CacheAwarePolicy(RoutingPolicy):
    """Prefix affinity while load is balanced, least in-flight when it is not (see ``prefix_tree``)."""

    name = "cache_aware"
    needs_body = True

    def __init__(self, index: CacheAwareIndex) -> None:
        super().__init__()
        self.index = index

    def select(self, candidates: Sequence[Target], request: RoutingRequest) -> Target:
        # Like upstream, a body without prompt text falls back to the session header as the key.
        text = routing_text(request.body) or header_hash_key(request.headers) or ""
        loads = [(t.id, self.in_flight.get(t.id, 0)) for t in candidates]
        chosen, self.last_decision = self.index.choose_by_load(text, loads)
        if text:
            self.index.insert(text, chosen)
        return next(t for t in candidates if t.id == chosen)

    def on_targets_removed(self, target_ids: Sequence[str]) -> None:
        for tid in target_ids:
            self.index.remove_target(tid)


SESSION_EXPIRATION_ENV = "VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S"
DEFAULT_SESSION_EXPIRATION_SECS = 7200.0
MAX_STICKY_SESSIONS = 100_000
_SWEEP_INTERVAL_SECS = 60.0


class StickyLeastLoadedPolicy(RoutingPolicy):
    """Sticky sessions, each new one on the target holding the fewest sessions (upstream's semantics).

    A session is the consistent-hash key's header or body field (``x-session-id``, ``user`` …). Its first
    request goes to the candidate with the fewest live sessions, ties broken by rendezvous hashing of
    ``<session>:<target>`` (so the same tie always resolves the same way); later requests follow it while
    that target is a candidate, else it is placed again. A request without a session goes to the least
    loaded target too but is not remembered. Sessions expire ``expiration`` seconds after their last
    request (2 h, or ``$VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S``), and at most ``max_sessions`` are kept
    (the least recently used goes first), so memory stays bounded.
    """

    name = "sticky_least_loaded"
    needs_body = True

    def __init__(
        self, expiration: float, clock: Callable[[], float], max_sessions: int = MAX_STICKY_SESSIONS
    ) -> None:
        super().__init__()
        self.expiration = expiration
        self.max_sessions = max_sessions
        self._clock = clock
        self.sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()  # key -> (target id, last use)
        self.session_counts: dict[str, int] = {}
        self._last_sweep = clock()

    def select(self, candidates: Sequence[Target], request: RoutingRequest) -> Target:
        now = self._clock()
        self._sweep(now)
        key = header_hash_key(request.headers) or body_hash_key(request.body)
        if key is None:
            tie = routing_text(request.body) or request.raw_body.decode("utf-8", "replace")
            return self._least_loaded(candidates, tie)
        entry = self.sessions.get(key)
        if entry is not None:
            target = next((t for t in candidates if t.id == entry[0]), None)
            if target is not None:
                self.sessions[key] = (target.id, now)
                self.sessions.move_to_end(key)
                return target
            self._forget(key)
        target = self._least_loaded(candidates, key)
        self.sessions[key] = (target.id, now)
        self.session_counts[target.id] = self.session_counts.get(target.id, 0) + 1
        while len(self.sessions) > self.max_sessions:
            self._forget(next(iter(self.sessions)))
        return target

    def on_targets_removed(self, target_ids: Sequence[str]) -> None:
        gone = set(target_ids)
        for key in [k for k, (tid, _) in self.sessions.items() if tid in gone]:
            self._forget(key)

    def _least_loaded(self, candidates: Sequence[Target], tie: str) -> Target:
        least = min(self.session_counts.get(t.id, 0) for t in candidates)
        tied = [t for t in candidates if self.session_counts.get(t.id, 0) == least]
        return max(tied, key=lambda t: (stable_hash64(f"{tie}:{t.id}"), t.id))

    def _forget(self, key: str) -> None:
        tid, _ = self.sessions.pop(key)
        left = self.session_counts.get(tid, 0) - 1
        if left > 0:
            self.session_counts[tid] = left
        else:
            self.session_counts.pop(tid, None)

    def _sweep(self, now: float) -> None:
        """Drop expired sessions, at most once a minute (the oldest are first: the dict is in use order)."""
        if now - self._last_sweep < _SWEEP_INTERVAL_SECS:
            return
        self._last_sweep = now
        while self.sessions:
            key, (_, last_use) = next(iter(self.sessions.items()))
            if now - last_use < self.expiration:
                break
            self._forget(key)


def session_expiration(environ: Mapping[str, str]) -> float:
    """Upstream's ``$VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S``, else 2 h; a bad value is an error."""
    raw = environ.get(SESSION_EXPIRATION_ENV)
    if raw is None:
        return DEFAULT_SESSION_EXPIRATION_SECS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(f"{SESSION_EXPIRATION_ENV}={raw!r}: expected a positive number of seconds")
    return value


def cache_index_for(config: RouterConfig) -> CacheAwareIndex:
    """The one prefix index a router shares between native cache_aware and Program cache_aware binding."""
    return CacheAwareIndex(
        config.max_tree_size,
        cache_threshold=config.cache_threshold,
        balance_abs_threshold=config.balance_abs_threshold,
        balance_rel_threshold=config.balance_rel_threshold,
    )


def build_policy(
    config: RouterConfig,
    cache_index: CacheAwareIndex | None = None,
    clock: Callable[[], float] | None = None,
) -> RoutingPolicy:
    """The policy named by ``config.policy``; cache_aware uses ``cache_index`` when given (shared).

    ``clock`` (monotonic seconds) is needed by sticky_least_loaded, whose sessions expire.
    """
    match config.policy:
        case PolicyName.RANDOM:
            return RandomPolicy()
        case PolicyName.ROUND_ROBIN:
            return RoundRobinPolicy()
        case PolicyName.CONSISTENT_HASH:
            return ConsistentHashPolicy()
        case PolicyName.POWER_OF_TWO:
            return PowerOfTwoPolicy()
        case PolicyName.CACHE_AWARE:
            return CacheAwarePolicy(cache_index or cache_index_for(config))
        case PolicyName.KV_AWARE:
            from progrouter.routing.kv_aware import build_kv_aware  # it builds on this module's policies

            if clock is None:
                raise ValueError("kv_aware needs a clock")
            return build_kv_aware(config, CacheAwarePolicy(cache_index or cache_index_for(config)), clock)
        case PolicyName.STICKY_LEAST_LOADED:
            if clock is None:
                raise ValueError("sticky_least_loaded needs a clock")
            return StickyLeastLoadedPolicy(session_expiration(os.environ), clock)
    raise ValueError(f"unknown policy {config.policy!r}")
