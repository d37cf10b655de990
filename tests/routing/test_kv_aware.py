"""kv_aware on hand-made residency: prefix holder wins, cold prefixes by load, temperature, affinity,
the not-yet-announced prefix of a burst, and the old behaviour when events or token ids are missing."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from progrouter.config import RouterConfig
from progrouter.observe.kv_events import in_worker_thread
from progrouter.routing.kv_aware import OFFLOAD_BYTES, KvAwarePolicy, KvAwareSettings, PendingBlocks
from progrouter.routing.kv_residency import ResidencyIndex, chain_keys
from progrouter.routing.policies import CacheAwarePolicy, RoutingRequest, build_policy
from progrouter.routing.prefix_tree import CacheAwareIndex
from progrouter.routing.target import Target, expand_targets
from progrouter.routing.tokenize import PromptTokenizer
from support.tiny_tokenizer import token_id, write_tiny_tokenizer

BS = 4
TARGETS = expand_targets(["http://a:1", "http://b:1"], 1)
A, B = TARGETS
PREFIX = list(range(1000, 1000 + 4 * BS))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def policy(
    clock: Clock | None = None, tokenizer: PromptTokenizer | None = None, **settings: Any
) -> KvAwarePolicy:
    fallback = CacheAwarePolicy(CacheAwareIndex(10_000))
    return KvAwarePolicy(
        ResidencyIndex(),
        KvAwareSettings(block_size=BS, **settings),
        tokenizer,
        fallback,
        clock or Clock(),
        random.Random(7),
    )


def hear(p: KvAwarePolicy, target: Target, tokens: list[int], seq: int = 0) -> None:
    """``target`` announces ``tokens``' full blocks (one BlockStored from the root)."""
    full = len(tokens) // BS * BS
    hashes = [hash((target.id, i)) for i in range(full // BS)]
    events: list[list[Any]] = [["BlockStored", hashes, None, tokens[:full], BS, None, "GPU"]] if full else []
    p.index.apply(target.id, seq, 1.0, events, now=1.0)


def ask(p: KvAwarePolicy, body: dict[str, Any], headers: dict[str, str] | None = None) -> Target:
    import orjson

    return p.select(TARGETS, RoutingRequest(headers or {}, body, orjson.dumps(body)))


def test_the_rank_holding_the_prefix_wins_at_temperature_zero() -> None:
    p = policy()
    hear(p, A, [])
    hear(p, B, PREFIX)
    assert ask(p, {"prompt": [*PREFIX, 1, 2, 3]}) == B
    assert p.last_decision == "cache_affinity"


def test_a_cold_prefix_goes_by_load() -> None:
    p = policy()
    hear(p, A, PREFIX)
    hear(p, B, [])
    p.on_start(A)  # A is busy
    assert ask(p, {"prompt": list(range(5000, 5000 + 3 * BS))}) == B
    assert p.last_decision == "low_match_min_load"


def test_cost_is_uncached_prefill_scaled_by_load() -> None:
    p = policy()
    n = len(PREFIX) + 2
    assert p.costs(TARGETS, n, {A.id: 4, B.id: 0}) == [2.0 + BS, float(n + BS)]
    hear(p, A, PREFIX)
    hear(p, B, [])
    p.on_start(A)
    assert ask(p, {"prompt": [*PREFIX, 1, 2]}) == A  # (2 + 4) × 2 = 12 < 22: the prefix holds A
    for _ in range(2):
        p.on_start(A)
    assert p.costs(TARGETS, n, {A.id: 4, B.id: 0}) == [(2.0 + BS) * 4, float(n + BS)]
    assert ask(p, {"prompt": [*PREFIX, 3, 4]}) == B  # 24 > 22: A is busy enough to pay the prefill on B


def test_equal_costs_go_to_the_emptier_rank() -> None:
    p = policy()
    hear(p, A, list(range(3000, 3000 + 8 * BS)))  # A holds 8 blocks of something else
    hear(p, B, [])
    assert ask(p, {"prompt": list(range(6000, 6000 + 3 * BS))}) == B  # cold, nothing in flight: emptier B
    p.on_start(B)
    assert ask(p, {"prompt": list(range(6500, 6500 + 3 * BS))}) == A  # in-flight count comes first


def test_a_burst_sharing_a_cold_prefix_stays_together_before_the_events_arrive() -> None:
    p = policy()
    hear(p, A, [])
    hear(p, B, [])
    first = ask(p, {"prompt": [*PREFIX, 1]})
    p.on_start(first)
    assert ask(p, {"prompt": [*PREFIX, 2]}) == first  # pending blocks count as held for a while


def test_pending_blocks_expire() -> None:
    clock = Clock()
    p = policy(clock)
    hear(p, A, [])
    hear(p, B, [])
    keys = chain_keys([*PREFIX, 1], BS)
    first = ask(p, {"prompt": [*PREFIX, 1]})
    assert p.pending.match(first.id, keys, clock.now) == len(keys)
    clock.now += 10
    assert p.pending.match(first.id, keys, clock.now) == 0


def test_every_rank_unknown_falls_back_to_cache_aware() -> None:
    p = policy()  # nothing heard from any Rank
    p.on_start(A)
    assert ask(p, {"prompt": PREFIX}) == B  # cache_aware: no text to match, least in flight
    assert p.last_decision == "low_match_min_load"  # cache_aware's own decision name
    assert not p.pending._by_target  # the KV path was not taken


def test_an_unknown_rank_gets_no_cache_credit() -> None:
    p = policy()
    hear(p, A, [])  # A is heard (holds nothing); B is silent
    p.on_start(B)
    assert ask(p, {"prompt": PREFIX}) == A  # B: unknown, so load-only, and it is busier


def test_text_without_tokenizer_is_routed_by_characters_and_with_one_by_tokens(tmp_path: Path) -> None:
    p = policy()
    words = " ".join(f"w{i}" for i in range(4 * BS))
    hear(p, A, [])
    hear(p, B, [])
    ask(p, {"prompt": words})
    assert p.fallback.index.size(A.id) + p.fallback.index.size(B.id) > 0  # went the character way
    tok = PromptTokenizer.load(str(write_tiny_tokenizer(tmp_path / "m")))
    q = policy(tokenizer=tok)
    hear(q, A, [])
    hear(q, B, tok.encode_text(words))
    assert ask(q, {"prompt": words + " w499"}) == B
    assert q.fallback.index.size(A.id) + q.fallback.index.size(B.id) == 0
    assert tok.encode_text("w0")[1] == token_id("w0")


def test_temperature_samples_by_cost() -> None:
    clock = Clock()
    hot = policy(clock, temperature=1.0)
    hear(hot, A, PREFIX)
    hear(hot, B, [])
    picks: Counter[Target] = Counter()
    for i in range(400):
        clock.now += 10  # no pending blocks from the previous pick
        picks[ask(hot, {"prompt": [*PREFIX, i]})] += 1
    # costs scaled to [0, 1]: A 0, B 1, so P(A) = 1 / (1 + e^-1) ≈ 0.73
    assert 0.63 < picks[A] / 400 < 0.83
    cold = policy(temperature=0.0)
    hear(cold, A, PREFIX)
    hear(cold, B, [])
    assert {ask(cold, {"prompt": [*PREFIX, i]}) for i in range(50)} == {A}


def test_session_affinity_holds_until_idle_for_the_ttl() -> None:
    clock = Clock()
    p = policy(clock, affinity_ttl=30.0)
    hear(p, A, [])
    hear(p, B, PREFIX)
    s = {"x-session-id": "s1"}
    assert ask(p, {"prompt": list(range(7000, 7000 + 2 * BS))}, s) == A  # cold: by load (tie → A)
    assert ask(p, {"prompt": PREFIX}, s) == A  # held by the session though B has the prefix
    clock.now += 29
    assert ask(p, {"prompt": PREFIX}, s) == A
    clock.now += 31  # idle past the TTL: decided again
    assert ask(p, {"prompt": PREFIX}, s) == B
    assert ask(p, {"prompt": list(range(7000, 7000 + 2 * BS))}, {"x-session-id": "s2"}) == A
    p.on_targets_removed([A.id])
    assert "s2" not in p._sessions


def test_without_affinity_ttl_sessions_are_not_remembered() -> None:
    p = policy()
    hear(p, A, [])
    hear(p, B, PREFIX)
    assert ask(p, {"prompt": PREFIX}, {"x-session-id": "s1"}) == B
    assert not p._sessions


def test_build_policy_makes_kv_aware_from_the_config(tmp_path: Path) -> None:
    cfg = RouterConfig(
        worker_urls=["http://a:1"],
        policy="kv_aware",
        kv_event_block_size=32,
        router_temperature=0.5,
        kv_aware_session_affinity_ttl_secs=9,
        tokenizer=str(write_tiny_tokenizer(tmp_path / "m")),
    )
    p = build_policy(cfg, None, Clock())
    assert isinstance(p, KvAwarePolicy)
    assert p.settings == KvAwareSettings(block_size=32, temperature=0.5, affinity_ttl=9.0)
    assert p.tokenizer is not None and p.prepares


@pytest.mark.parametrize("size", [10, 4_000])
async def test_prepare_keys_long_prompts_off_the_loop_once(tmp_path: Path, size: int) -> None:
    import orjson

    tok = PromptTokenizer.load(str(write_tiny_tokenizer(tmp_path / "m")))
    p = policy(tokenizer=tok)
    p.offload = in_worker_thread
    body = {"prompt": " ".join(f"w{i % 500}" for i in range(size))}
    request = RoutingRequest({}, body, orjson.dumps(body))
    await p.prepare(request)
    assert (request.raw_body in p._memo) == (len(request.raw_body) >= OFFLOAD_BYTES)
    ids = tok.encode_text(body["prompt"])
    assert p.prompt_keys(request) == (len(ids), chain_keys(ids, BS))
    assert request.raw_body not in p._memo  # taken: the memo keeps no body past its select()
    as_ids = {"prompt": ids}
    by_ids = RoutingRequest({}, as_ids, orjson.dumps(as_ids))
    await p.prepare(by_ids)  # token ids are keyed on the loop: no thread hop for Python work
    assert by_ids.raw_body not in p._memo
    assert p.prompt_keys(by_ids) == (len(ids), chain_keys(ids, BS))


def test_pending_blocks_stay_bounded() -> None:
    pending = PendingBlocks(seconds=2.0, max_blocks=100)
    pending.add("t", list(range(80)), now=0.0)
    pending.add("t", list(range(80, 160)), now=5.0)  # over the bound: the expired first 80 go
    assert len(pending._by_target["t"]) == 80 and pending.match("t", [80, 81], 5.0) == 2
    pending.add("t", list(range(1000, 1200)), now=5.5)  # still too many once expired ones go: cleared
    assert pending._by_target["t"] == {}
