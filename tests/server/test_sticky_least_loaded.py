"""sticky_least_loaded: sessions stick, new ones go where the fewest live, sessions expire (fake clock)."""

from __future__ import annotations

from collections import Counter

import aiohttp
import pytest

from progrouter.routing.policies import RoutingRequest, StickyLeastLoadedPolicy, session_expiration
from progrouter.routing.target import expand_targets
from support.factories import RouterFactory

from .conftest import WorkerFactory

TARGETS = expand_targets(["http://a:1", "http://b:1", "http://c:1"], 1)


def _session(key: str) -> RoutingRequest:
    return RoutingRequest({"x-session-id": key}, None, b"{}")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_new_sessions_spread_and_stay() -> None:
    policy = StickyLeastLoadedPolicy(expiration=100, clock=Clock())
    first = {f"s{i}": policy.select(TARGETS, _session(f"s{i}")).id for i in range(6)}
    assert Counter(first.values()) == {t.id: 2 for t in TARGETS}  # least sessions first
    for _ in range(3):
        assert {k: policy.select(TARGETS, _session(k)).id for k in first} == first
    assert policy.session_counts == {t.id: 2 for t in TARGETS}


def test_body_fields_are_sessions_and_stateless_requests_are_not_remembered() -> None:
    policy = StickyLeastLoadedPolicy(expiration=100, clock=Clock())
    by_user = RoutingRequest({}, {"user": "u1", "prompt": "x"}, b"{}")
    chosen = policy.select(TARGETS, by_user)
    assert all(policy.select(TARGETS, by_user) == chosen for _ in range(5))
    stateless = RoutingRequest({}, {"prompt": "hello"}, b"{}")
    policy.select(TARGETS, stateless)
    assert list(policy.sessions) == ["user:u1"]
    # a stateless request goes to a target with the fewest sessions (not the one holding u1)
    assert policy.select(TARGETS, stateless) != chosen


def test_a_session_whose_target_left_is_placed_again() -> None:
    policy = StickyLeastLoadedPolicy(expiration=100, clock=Clock())
    home = policy.select(TARGETS, _session("s"))
    rest = [t for t in TARGETS if t != home]
    moved = policy.select(rest, _session("s"))
    assert moved != home and policy.select(TARGETS, _session("s")) == moved
    policy.on_targets_removed([moved.id])
    assert policy.sessions == {} and policy.session_counts == {}


def test_sessions_expire_and_are_bounded() -> None:
    clock = Clock()
    policy = StickyLeastLoadedPolicy(expiration=120, max_sessions=3, clock=clock)
    for i in range(5):
        policy.select(TARGETS, _session(f"s{i}"))
    assert [k.rsplit(":", 1)[1] for k in policy.sessions] == ["s2", "s3", "s4"]  # least recently used out
    assert sum(policy.session_counts.values()) == 3
    clock.now = 100.0
    policy.select(TARGETS, _session("s4"))  # keeps s4 alive
    clock.now = 200.0
    policy.select(TARGETS, _session("s5"))
    assert [k.rsplit(":", 1)[1] for k in policy.sessions] == ["s4", "s5"]


def test_the_expiration_comes_from_upstreams_variable() -> None:
    assert session_expiration({}) == 7200
    assert session_expiration({"VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S": "30"}) == 30
    for bad in ("soon", "0", "-5"):
        with pytest.raises(ValueError, match="VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S"):
            session_expiration({"VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S": bad})


async def test_sticky_least_loaded_over_loopback(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    workers = [await make_worker() for _ in range(3)]
    router = await make_router([w.url for w in workers], policy="sticky_least_loaded")
    homes: dict[str, set[str]] = {}
    for _ in range(3):
        for i in range(3):
            key = f"session-{i}"
            headers = {"x-session-id": key}
            async with client.post(router.url + "/v1/completions", json={}, headers=headers) as resp:
                assert resp.status == 200
                homes.setdefault(key, set()).add(resp.headers["X-Worker"])
    assert all(len(h) == 1 for h in homes.values())  # sticky
    assert len(set().union(*homes.values())) == 3  # one new session per worker
