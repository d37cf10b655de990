from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from progrouter.config import RouterConfig
from progrouter.routing.policies import (
    CacheAwarePolicy,
    ConsistentHashPolicy,
    PowerOfTwoPolicy,
    RandomPolicy,
    RoundRobinPolicy,
    RoutingRequest,
    build_policy,
)
from progrouter.routing.prefix_tree import CacheAwareIndex
from progrouter.routing.request_text import routing_text
from progrouter.routing.target import Target, expand_targets

TARGETS = expand_targets(["http://a:1", "http://b:1"], 2)
EMPTY = RoutingRequest({}, None, b"")


def _req(headers: dict[str, str] | None = None, body: Mapping[str, Any] | None = None) -> RoutingRequest:
    return RoutingRequest(headers or {}, body, b"{}")


def test_round_robin_cycles_in_order() -> None:
    policy = RoundRobinPolicy()
    picks = [policy.select(TARGETS, EMPTY).id for _ in range(8)]
    assert picks == [t.id for t in TARGETS] * 2


def test_random_covers_all_targets_roughly_uniformly() -> None:
    policy = RandomPolicy(seed=1)
    counts = Counter(policy.select(TARGETS, EMPTY).id for _ in range(4000))
    assert set(counts) == {t.id for t in TARGETS}
    assert min(counts.values()) > 800


def test_power_of_two_picks_the_less_loaded_of_two() -> None:
    policy = PowerOfTwoPolicy(seed=2)
    busy, idle = Target.parse("http://busy:1"), Target.parse("http://idle:1")
    for _ in range(5):
        policy.on_start(busy)
    assert all(policy.select([busy, idle], EMPTY) == idle for _ in range(50))
    for _ in range(5):
        policy.on_finish(busy)
    assert policy.in_flight == {}
    # with three targets, the most loaded one is never chosen
    third = Target.parse("http://third:1")
    for _ in range(3):
        policy.on_start(busy)
    assert busy not in {policy.select([busy, idle, third], EMPTY) for _ in range(200)}


def test_consistent_hash_is_sticky_and_order_independent() -> None:
    a, b = ConsistentHashPolicy(), ConsistentHashPolicy()
    reordered = list(reversed(TARGETS))
    for i in range(200):
        req = _req({"x-session-id": f"s{i}"})
        first = a.select(TARGETS, req)
        assert a.select(TARGETS, req) == first
        assert b.select(reordered, req) == first
    spread = Counter(a.select(TARGETS, _req({"X-User-Id": f"u{i}"})).id for i in range(400))
    assert len(spread) == len(TARGETS)


def test_consistent_hash_uses_body_fields() -> None:
    policy = ConsistentHashPolicy()
    picks = {policy.select(TARGETS, _req(body={"user": "alice", "prompt": str(i)})).id for i in range(20)}
    assert len(picks) == 1


def test_consistent_hash_only_moves_keys_of_a_removed_target() -> None:
    policy = ConsistentHashPolicy()
    before = {i: policy.select(TARGETS, _req({"x-session-id": str(i)})) for i in range(300)}
    survivors = TARGETS[1:]
    for i, target in before.items():
        after = policy.select(survivors, _req({"x-session-id": str(i)}))
        if target in survivors:
            assert after == target


def test_cache_aware_sticks_to_the_prefix_and_spreads_new_text() -> None:
    policy = CacheAwarePolicy(CacheAwareIndex(100_000, cache_threshold=0.5))
    conv = [{"role": "system", "content": "You are a careful coding agent. " * 5}]
    first = policy.select(TARGETS, _req(body={"messages": [*conv, {"role": "user", "content": "step 1"}]}))
    for step in range(2, 6):
        body = {"messages": [*conv, {"role": "user", "content": f"step {step}"}]}
        assert policy.select(TARGETS, _req(body=body)) == first
        assert policy.last_decision == "cache_affinity"
    others = {policy.select(TARGETS, _req(body={"prompt": f"unrelated text {i}"})).id for i in range(3)}
    assert first.id not in others  # fresh text goes to the targets with the smallest trees


def test_cache_aware_balances_load_when_imbalanced() -> None:
    policy = CacheAwarePolicy(CacheAwareIndex(100_000, balance_abs_threshold=2, balance_rel_threshold=1.5))
    body = {"prompt": "the same prompt every time"}
    home = policy.select(TARGETS, _req(body=body))
    for _ in range(3):
        policy.on_start(home)
    chosen = policy.select(TARGETS, _req(body=body))
    assert chosen != home and policy.last_decision == "load_balance"
    policy.on_targets_removed([home.id])
    assert policy.index.size(home.id) == 0


def test_cache_aware_falls_back_to_the_session_header_without_text() -> None:
    policy = CacheAwarePolicy(CacheAwareIndex(100_000, cache_threshold=0.5))
    req = _req({"x-session-id": "abc"})
    first = policy.select(TARGETS, req)
    assert all(policy.select(TARGETS, req) == first for _ in range(5))


@pytest.mark.parametrize(
    "name", ["random", "round_robin", "consistent_hash", "power_of_two", "cache_aware", "sticky_least_loaded"]
)
def test_build_policy_by_name(name: str) -> None:
    policy = build_policy(RouterConfig(worker_urls=["http://a:1"], policy=name), clock=lambda: 0.0)
    assert policy.name == name
    assert policy.select(TARGETS[:1], EMPTY) == TARGETS[0]


def test_routing_text_reads_the_prompt_fields_in_order() -> None:
    body = {
        "system": [{"type": "text", "text": "sys"}],
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]},
        ],
        "max_tokens": 5,
    }
    assert routing_text(body) == "sys\nuser\nhello\nassistant\nhi"
    assert routing_text({"prompt": ["a", "b"]}) == "a\nb"
    assert routing_text({"input": "x", "instructions": "be brief"}) == "be brief\nx"
    assert routing_text(None) == ""
