"""``--policy kv_aware``: each request to the Rank where it costs least, by what the Ranks really hold.

Cost of Rank r for a prompt of n tokens: ``(n − cached_r + block_size) × (1 + in_flight_r)``, where
``cached_r`` is the tokens of the prompt's leading full blocks resident on r (from r's KV events, see
``kv_residency``, or routed there in the last ``PENDING_SECONDS`` and not announced yet) and ``in_flight_r``
the requests this router has in flight there. The uncached prefill is the work the request brings; the load
scales it (as upstream's multiplicative scorer), so a long cached prefix holds its Rank until that Rank is
busier by about the ratio of the prefill it saves, and equal prefills (a cold prompt) go by load. The added
block keeps a fully cached prompt sensitive to load. Temperature 0 takes the cheapest (ties: fewer in
flight, then fewer resident blocks, then candidate order); T > 0 samples ``softmax(−c/T)`` over costs
scaled to [0, 1] by their range. With a session affinity TTL, a session (its consistent-hash key) stays on
its Rank while it is a candidate and has not been idle for the TTL.

A Rank whose events are not heard (``unknown``) gets no cache credit (load-only). When every candidate is
unknown, or the prompt's token ids cannot be known (a text prompt and no ``--tokenizer``), the request goes
the old way: ``cache_aware``'s character-level prefix tree.
"""

from __future__ import annotations

import logging
import math
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from progrouter.config import RouterConfig
from progrouter.routing.hash_key import body_hash_key, header_hash_key
from progrouter.routing.kv_residency import ResidencyIndex, chain_keys
from progrouter.routing.policies import CacheAwarePolicy, RoutingPolicy, RoutingRequest
from progrouter.routing.target import Target
from progrouter.routing.tokenize import PromptTokenizer, needs_tokenizer, prompt_token_ids

log = logging.getLogger(__name__)
Offload = Callable[[Callable[[], Any]], Awaitable[Any]]  # runs work off the event loop (the shell's)
PENDING_SECONDS = 2.0  # how long a routed prefix counts as resident before its BlockStored arrives
MAX_PENDING_BLOCKS = 65_536  # per target
MAX_AFFINITY_SESSIONS = 100_000
MEMO_ENTRIES = 64  # prompts tokenized ahead of select() and not yet taken (a client left meanwhile)
OFFLOAD_BYTES = 1024  # longer bodies are tokenized and keyed in a worker thread (bench/tokenize_prompt.py)


@dataclass(frozen=True, slots=True)
class KvAwareSettings:
    block_size: int = 16
    temperature: float = 0.0
    affinity_ttl: float | None = None


class PendingBlocks:
    """Chain keys routed to each target recently: resident soon, not yet announced (expiring, bounded).

    A plain dict per target filled in bulk (``dict.fromkeys``): a long cold prompt adds hundreds of keys per
    request, so no per-key Python work. Expired keys are ignored by ``match`` and dropped when a target's
    dict passes ``max_blocks`` (all of it, if what is left is still too many: then it under-reports)."""

    def __init__(self, seconds: float = PENDING_SECONDS, max_blocks: int = MAX_PENDING_BLOCKS) -> None:
        self.seconds = seconds
        self.max_blocks = max_blocks
        self._by_target: dict[str, dict[int, float]] = {}

    def add(self, target_id: str, keys: Sequence[int], now: float) -> None:
        held = self._by_target.setdefault(target_id, {})
        held.update(dict.fromkeys(keys, now + self.seconds))
        if len(held) > self.max_blocks:
            fresh = {k: until for k, until in held.items() if until > now}
            self._by_target[target_id] = fresh if len(fresh) <= self.max_blocks else {}

    def match(self, target_id: str, keys: Sequence[int], now: float) -> int:
        held = self._by_target.get(target_id)
        n = 0
        if held:
            for key in keys:
                until = held.get(key)
                if until is None or until <= now:
                    break
                n += 1
        return n

    def forget(self, target_id: str) -> None:
        self._by_target.pop(target_id, None)


class KvAwarePolicy(RoutingPolicy):
    name = "kv_aware"
    needs_body = True
    prepares = True

    def __init__(
        self,
        index: ResidencyIndex,
        settings: KvAwareSettings,
        tokenizer: PromptTokenizer | None,
        fallback: CacheAwarePolicy,
        clock: Callable[[], float],
        rng: random.Random | None = None,
    ) -> None:
        super().__init__()
        self.index = index
        self.settings = settings
        self.tokenizer = tokenizer
        self.fallback = fallback
        self.fallback.in_flight = self.in_flight  # one load count, whichever way a request went
        self.pending = PendingBlocks()
        self._clock = clock
        self._rng = rng or random.Random()
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.offload: Offload | None = None  # set by the shell that runs the policy (observe/kv_events.py)
        self._memo: OrderedDict[bytes, tuple[int, list[int]] | None] = OrderedDict()

    # ------------------------------------------------------------------ tokens
    def prompt_keys(self, request: RoutingRequest) -> tuple[int, list[int]] | None:
        """(prompt tokens, chain keys of its full blocks), taken from the memo ``prepare`` filled (so the memo
        holds a body only between the two calls), else computed; None when the ids cannot be known."""
        if request.raw_body in self._memo:
            return self._memo.pop(request.raw_body)
        return self._keys(request.body)

    def _keys(self, body: Mapping[str, Any] | None) -> tuple[int, list[int]] | None:
        ids = prompt_token_ids(body, self.tokenizer)
        return None if ids is None else (len(ids), chain_keys(ids, self.settings.block_size))

    async def prepare(self, request: RoutingRequest) -> None:
        """Tokenize and key a long text or chat prompt off the event loop (``offload``), for select() to find.
        Token-id prompts stay on the loop: keying them is Python work that would hold the GIL in a thread."""
        raw = request.raw_body
        if self.offload is None or len(raw) < OFFLOAD_BYTES or raw in self._memo:
            return
        if self.tokenizer is None or not needs_tokenizer(request.body):
            return
        body = request.body
        self._memo[raw] = await self.offload(lambda: self._keys(body))
        while len(self._memo) > MEMO_ENTRIES:
            self._memo.popitem(last=False)

    # ------------------------------------------------------------------ choosing
    def select(self, candidates: Sequence[Target], request: RoutingRequest) -> Target:
        now = self._clock()
        session = self._session_key(request)
        if session is not None:
            held = self._sessions.get(session)
            if held is not None and now - held[1] < (self.settings.affinity_ttl or 0.0):
                target = next((t for t in candidates if t.id == held[0]), None)
                if target is not None:
                    self._bind(session, target, now)
                    self.last_decision = "cache_affinity"
                    return target
        prompt = self.prompt_keys(request)
        n_tokens, keys = prompt if prompt is not None else (0, [])
        matched = {t.id: self.index.match(t.id, keys) for t in candidates}
        if prompt is None or all(m is None for m in matched.values()):
            target = self.fallback.select(candidates, request)
            self.last_decision = self.fallback.last_decision
        else:
            cached = {t.id: max(matched[t.id] or 0, self.pending.match(t.id, keys, now)) for t in candidates}
            target = self._pick(candidates, n_tokens, cached)
            self.pending.add(target.id, keys[cached[target.id] :], now)
            self.last_decision = "cache_affinity" if cached[target.id] else "low_match_min_load"
        if session is not None:
            self._bind(session, target, now)
        return target

    def costs(
        self, candidates: Sequence[Target], prompt_tokens: int, cached: Mapping[str, int]
    ) -> list[float]:
        """Each candidate's cost: this prompt's uncached prefill there (plus a block), scaled by its load."""
        block = self.settings.block_size
        return [
            float(prompt_tokens - cached[t.id] * block + block) * (1 + self.in_flight.get(t.id, 0))
            for t in candidates
        ]

    def _pick(self, candidates: Sequence[Target], prompt_tokens: int, cached: Mapping[str, int]) -> Target:
        costs = self.costs(candidates, prompt_tokens, cached)
        if self.settings.temperature <= 0.0 or len(candidates) == 1:
            best = min(range(len(candidates)), key=lambda i: (costs[i], *self._emptiness(candidates[i])))
            return candidates[best]
        low, high = min(costs), max(costs)
        span = (high - low) or 1.0
        weights = [math.exp(-(c - low) / span / self.settings.temperature) for c in costs]
        return self._rng.choices(list(candidates), weights=weights)[0]

    def _emptiness(self, target: Target) -> tuple[int, int]:
        """Tie-breakers, least first: requests in flight, then blocks the Rank holds. Agent sessions sit idle
        between tool calls, so equal in-flight counts are common; the Rank with the emptier KV cache then
        takes the new prefix (as cache_aware's smallest tree does), instead of always the first Rank."""
        state = self.index.ranks.get(target.id)
        return self.in_flight.get(target.id, 0), len(state.engine_to_key) if state is not None else 0

    # ------------------------------------------------------------------ load and sessions
    def on_targets_removed(self, target_ids: Sequence[str]) -> None:
        self.fallback.on_targets_removed(target_ids)
        gone = set(target_ids)
        for tid in gone:
            self.pending.forget(tid)
        for key in [k for k, (tid, _) in self._sessions.items() if tid in gone]:
            del self._sessions[key]

    def _session_key(self, request: RoutingRequest) -> str | None:
        if self.settings.affinity_ttl is None:
            return None
        return header_hash_key(request.headers) or body_hash_key(request.body)

    def _bind(self, session: str, target: Target, now: float) -> None:
        self._sessions[session] = (target.id, now)
        self._sessions.move_to_end(session)
        while len(self._sessions) > MAX_AFFINITY_SESSIONS:
            self._sessions.popitem(last=False)


def build_kv_aware(
    config: RouterConfig, fallback: CacheAwarePolicy, clock: Callable[[], float]
) -> KvAwarePolicy:
    """The policy ``config`` describes, with an empty index (``observe.kv_events`` fills it)."""
    tokenizer = PromptTokenizer.load(config.tokenizer) if config.tokenizer is not None else None
    if tokenizer is None:
        log.warning(
            "kv_aware: no --tokenizer, so text and chat prompts are routed by characters (as cache_aware); "
            "token-id prompts are matched against the KV events"
        )
    settings = KvAwareSettings(
        block_size=config.kv_event_block_size,
        temperature=config.router_temperature,
        affinity_ttl=config.kv_aware_session_affinity_ttl_secs,
    )
    return KvAwarePolicy(ResidencyIndex(), settings, tokenizer, fallback, clock)
