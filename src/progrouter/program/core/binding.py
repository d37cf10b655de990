"""Initial binding: which Rank a new Program generation calls home (upstream §3.3).

Evaluated once per generation, and again only when the home Rank disappears (failover). The binding is only
the *home*: admission, resume and migration decide separately. Five strategies:

- ``consistent_hash``: a per-pool ring over the Ranks (``hash_virtual_nodes`` points each) keyed by the
  identity's placement hash key, so a Program and plain requests of the same session meet on one Rank;
- ``program_round_robin``: a per-pool counter over the sorted Ranks;
- ``least_program_count``: fewest accounted Programs (Active, or Paused and waiting), then the smaller id;
- ``reasoning_token_balance``: most capacity left after the accounted Programs' private tokens (a Rank of
  unknown size under ``"auto"`` counts as capacity 0: one with room left is preferred to it);
- ``cache_aware``: the router's prefix tree weighted by KV pressure, among the Ranks that could admit the
  Program right now (all of them if none could). Pending cold Programs count toward pressure, so a cold
  burst spreads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from progrouter.config import BindingStrategy, ProgramSchedulingConfig
from progrouter.program.core.demand import required_tokens
from progrouter.routing.hash_ring import HashRing
from progrouter.routing.prefix_tree import CacheAwareIndex

if TYPE_CHECKING:
    from progrouter.program.core.ledger import CapacityLedger
    from progrouter.program.core.queues import RankQueues
    from progrouter.program.core.rank_facts import RankViews
    from progrouter.program.core.request_pool import RequestPool


@dataclass(frozen=True, slots=True)
class BindingCandidate:
    """What a strategy may know about one Rank of the Program's pool."""

    rank_id: str
    accounted_programs: int
    accounted_tokens: int
    capacity_tokens: int | None  # the Rank's token capacity in force (None: the count guard alone)
    kv_pressure: float
    immediately_admissible: bool


class Binder:
    """The strategies and their per-pool state (hash rings, round-robin counters, the prefix tree)."""

    def __init__(self, config: ProgramSchedulingConfig, cache_index: CacheAwareIndex | None) -> None:
        self.strategy = config.binding_strategy
        self._virtual_nodes = config.hash_virtual_nodes
        self._rings: dict[str, HashRing] = {}
        self._round_robin: dict[str, int] = {}
        self.cache_index = cache_index
        if self.strategy is BindingStrategy.CACHE_AWARE and cache_index is None:
            self.cache_index = CacheAwareIndex(2**20)
        # Only cache_aware needs the request text (upstream passes it into acquire only then); decided
        # once, as every retained request asks.
        self.keeps_text = self.strategy is BindingStrategy.CACHE_AWARE
        # Only consistent_hash reads the placement hash key: the others spare the shell its body digest.
        self.reads_hash_key = self.strategy is BindingStrategy.CONSISTENT_HASH

    @property
    def needs_candidates(self) -> bool:
        return self.strategy in (
            BindingStrategy.LEAST_PROGRAM_COUNT,
            BindingStrategy.REASONING_TOKEN_BALANCE,
            BindingStrategy.CACHE_AWARE,
        )

    def pool_changed(self, model_pool: str) -> None:
        """The pool's Rank set changed: its ring is rebuilt on next use."""
        self._rings.pop(model_pool, None)

    def remove_rank(self, rank_id: str) -> None:
        if self.cache_index is not None:
            self.cache_index.remove_target(rank_id)

    def choose(
        self,
        model_pool: str,
        rank_ids: Sequence[str],
        placement_hash_key: str,
        routing_text: str | None,
        candidates: Callable[[], list[BindingCandidate]],
    ) -> str:
        """The home Rank among ``rank_ids`` (sorted, non-empty)."""
        if len(rank_ids) == 1:
            return rank_ids[0]
        strategy = self.strategy
        if strategy is BindingStrategy.CONSISTENT_HASH:
            ring = self._rings.get(model_pool)
            if ring is None:
                ring = self._rings[model_pool] = HashRing(rank_ids, self._virtual_nodes)
            return ring.lookup(placement_hash_key)
        if strategy is BindingStrategy.PROGRAM_ROUND_ROBIN:
            counter = self._round_robin.get(model_pool, 0)
            self._round_robin[model_pool] = counter + 1
            return rank_ids[counter % len(rank_ids)]
        facts = candidates()
        if strategy is BindingStrategy.LEAST_PROGRAM_COUNT:
            return min(facts, key=lambda c: (c.accounted_programs, c.rank_id)).rank_id
        if strategy is BindingStrategy.REASONING_TOKEN_BALANCE:
            return min(
                facts, key=lambda c: (-((c.capacity_tokens or 0) - c.accounted_tokens), c.rank_id)
            ).rank_id
        admissible = [c for c in facts if c.immediately_admissible] or facts
        assert self.cache_index is not None
        return self.cache_index.choose_initial(
            routing_text or "", [(c.rank_id, c.kv_pressure) for c in admissible]
        )

    def commit(self, routing_text: str | None, rank_id: str) -> None:
        """cache_aware: the text was sent to ``rank_id``, which now likely caches its prefix."""
        if self.cache_index is not None and routing_text:
            self.cache_index.insert(routing_text, rank_id)


def binding_candidates(
    config: ProgramSchedulingConfig,
    views: RankViews,
    queues: RankQueues,
    request_pool: RequestPool,
    ledger: CapacityLedger,
    rank_ids: Sequence[str],
    estimated_context_tokens: int,
    now: float,
) -> list[BindingCandidate]:
    """Per-Rank facts for the load-aware strategies over ``rank_ids`` (a pool's): O(queued Programs of the
    pool), once per generation."""
    decode_buffer = config.decode_buffer_tokens
    out = []
    for rank_id in rank_ids:
        view = views.of(rank_id, now)
        capacity = view.capacity
        queue = queues.get(rank_id)
        queued = (
            []
            if queue is None
            else [
                (p, required_tokens(p, request_pool.front_hints(p), decode_buffer)) for p in queue.ordered()
            ]
        )
        pending_new = sum(tokens for p, tokens in queued if p.lifecycle.completions.requests == 0)
        pressure = 0.0 if capacity is None else min(1.0, max(0.0, (view.used + pending_new) / capacity))
        out.append(
            BindingCandidate(
                rank_id=rank_id,
                accounted_programs=view.active + len(queued),
                accounted_tokens=ledger.ledger_tokens(rank_id) + sum(t for _, t in queued),
                capacity_tokens=capacity,
                kv_pressure=pressure,
                # admission's count guard and immediate token check, with upstream's binding demand
                immediately_admissible=view.count_fits
                and view.capacity_fits(estimated_context_tokens + decode_buffer),
            )
        )
    return out
