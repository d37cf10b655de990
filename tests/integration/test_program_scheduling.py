"""Router + emulator engine + Program scheduling over loopback: pool, usage, TTL, observation, errors."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import pytest

from progrouter.server.runner import RunningRouter
from support.factories import EngineFactory, RouterFactory

from .helpers import (
    CAPACITY,
    MODEL,
    program_body,
    read_sse_usage,
    wait_until,
    words,
)

pytestmark = pytest.mark.timeout(60)

PREFIX = "vllm_router_agent_aware_"
CHAT = "/v1/chat/completions"


async def diagnostics(client: aiohttp.ClientSession, router: RunningRouter) -> dict[str, Any]:
    async with client.get(router.url + "/scheduling/diagnostics") as response:
        assert response.status == 200
        data: dict[str, Any] = await response.json()
        return data


def rank(d: dict[str, Any]) -> dict[str, Any]:
    """The only Rank (empty before the first Program request registers its model pool)."""
    assert len(d["ranks"]) <= 1
    only: dict[str, Any] = d["ranks"][0] if d["ranks"] else {}
    return only


async def post(
    client: aiohttp.ClientSession, router: RunningRouter, body: dict[str, Any], path: str = CHAT, **kw: Any
) -> tuple[int, Any]:
    async with client.post(router.url + path, json=body, **kw) as response:
        if body.get("stream"):
            return response.status, await read_sse_usage(response)
        return response.status, await response.json()


def program_config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"token_capacity_per_dp_rank": CAPACITY, "metrics_interval_seconds": 0.1}
    config.update(overrides)
    return config


async def test_third_program_waits_in_the_pool_until_one_pauses(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    # The stalled engine queues every request; the waiting gate would then block all admission, and this
    # test is about token capacity.
    router = await make_router([engine.url], program_config(admission_waiting_request_threshold=0))
    engine.server.set_fault(0, "stall")

    def send(program: str, letter: str) -> asyncio.Task[tuple[int, Any]]:
        # ~1010 estimated tokens + 100 decode buffer each: two fit in 3000, three do not.
        return asyncio.create_task(post(client, router, program_body(program, words(letter, 1000))))

    first, second = send("prog-a", "a"), send("prog-b", "b")
    await wait_until(
        lambda: diagnostics(client, router), lambda d: rank(d).get("router_active_reasoning_programs") == 2
    )
    third = send("prog-c", "c")
    d = await wait_until(lambda: diagnostics(client, router), lambda d: d["retained_requests"] == 1)
    r = rank(d)
    assert r["router_active_programs"] == 2
    assert r["router_paused_reasoning_programs"] == 1
    assert 2000 < r["router_estimated_used_tokens"] <= CAPACITY
    assert not third.done()
    await asyncio.sleep(0.05)  # so the pooled request's wait is at least 50 ms by construction

    engine.server.set_fault(0, "none")
    results = await asyncio.wait_for(asyncio.gather(first, second, third), 30)
    assert [status for status, _ in results] == [200, 200, 200]
    assert all(body["usage"]["prompt_tokens"] > 1000 for _, body in results)
    # Without a TTL hint (and with an immature window) each finished Program paused at once.
    d = await wait_until(
        lambda: diagnostics(client, router), lambda d: rank(d)["router_active_programs"] == 0
    )
    assert d["retained_requests"] == 0
    assert [p["state"] for p in rank(d)["programs"]] == ["paused"] * 3
    assert rank(d)["router_estimated_used_tokens"] == 0
    target = rank(d)["target_id"]
    waited = router.registry.get_sample_value(PREFIX + "queue_wait_seconds_count", {"target": target})
    assert waited == 3

    def quantile(q: str) -> float | None:
        labels = {"target": target, "quantile": q}
        return router.registry.get_sample_value(PREFIX + "queue_wait_seconds", labels)

    # the pooled one waited for a pause (the summary's maximum); the first two went straight through
    assert (quantile("0.5") or 0.0) <= 0.05 < (quantile("1") or 0.0)


async def test_json_and_sse_usage_reach_the_scheduler(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url], program_config())
    status, body = await post(client, router, program_body("prog-json", words("j", 400)))
    assert status == 200
    assert body["usage"]["prompt_tokens"] > 400
    completion = {
        "model": MODEL,
        "prompt": words("s", 300),
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
        "vllm_xargs": {"agentic_context": '{"program_id": "prog-sse"}'},
    }
    status, usage = await post(client, router, completion, "/v1/completions")
    assert status == 200
    assert usage is not None and usage["prompt_tokens"] == 300
    status, usage = await post(
        client, router, program_body("prog-quiet", words("q", 100), stream=True, include_usage=False)
    )
    assert status == 200
    assert usage is None

    d = await diagnostics(client, router)
    estimation = {e["endpoint"]: e["tokens_per_byte"] for e in d["token_estimation"]}
    # Both the JSON and the streamed usage moved their endpoint's coefficient away from the 0.25 default.
    assert set(estimation) == {CHAT, "/v1/completions"}
    assert all(value != 0.25 for value in estimation.values())
    rolling = rank(d)["rolling"]
    assert rolling["request_samples"] >= 2
    assert rolling["avg_prompt_tokens"] > 0
    feedback = PREFIX + "token_estimate_feedback_total"
    labels = {"model_pool": f"program:model:{MODEL}", "endpoint": CHAT}
    assert router.registry.get_sample_value(feedback, {**labels, "outcome": "observed"}) == 1
    assert router.registry.get_sample_value(feedback, {**labels, "outcome": "missing"}) == 1


async def test_client_disconnect_while_pooled_leaks_nothing(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url], program_config(admission_waiting_request_threshold=0))
    engine.server.set_fault(0, "stall")
    holders = [
        asyncio.create_task(post(client, router, program_body(f"prog-{x}", words(x, 1000)))) for x in "ab"
    ]
    await wait_until(
        lambda: diagnostics(client, router), lambda d: rank(d).get("router_active_reasoning_programs") == 2
    )
    async with aiohttp.ClientSession() as impatient:
        pooled = asyncio.create_task(post(impatient, router, program_body("prog-c", words("c", 1000))))
        await wait_until(lambda: diagnostics(client, router), lambda d: d["retained_requests"] == 1)
        pooled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pooled
    # The retained request is withdrawn at once and its unstarted Program released.
    d = await wait_until(lambda: diagnostics(client, router), lambda d: d["retained_requests"] == 0)
    assert d["programs"] == 2
    assert rank(d)["router_paused_reasoning_programs"] == 0

    engine.server.set_fault(0, "none")
    assert [status for status, _ in await asyncio.gather(*holders)] == [200, 200]
    d = await wait_until(
        lambda: diagnostics(client, router), lambda d: rank(d)["router_active_programs"] == 0
    )
    r = rank(d)
    assert r["router_estimated_used_tokens"] == 0
    assert r["router_ledger_tokens"] == 0
    assert r["router_in_flight_requests"] == 0
    assert d["retained_requests"] == 0


async def test_malformed_agentic_context_is_a_400_and_creates_nothing(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url], program_config())
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "vllm_xargs": {"agentic_context": "{bad"},
    }
    status, answer = await post(client, router, body)
    assert status == 400
    message = "invalid Program identity: vllm_xargs.agentic_context must contain a bounded JSON object"
    assert answer["error"]["message"] == message
    d = await diagnostics(client, router)
    assert d["programs"] == 0
    assert d["retained_requests"] == 0


async def test_progress_ttl_keeps_a_program_warm_across_a_short_gap_not_a_long_one(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url], program_config())
    history = words("a", 1200)
    status, first = await post(client, router, program_body("prog-a", history, kv_retention_ttl_seconds=30))
    assert status == 200
    d = await diagnostics(client, router)
    (program,) = rank(d)["programs"]
    assert (program["state"], program["status"]) == ("active", "acting")
    assert program["ttl_remaining_seconds"] > 0

    # Short gap: the Program is still Active, its next request dispatches on its placement, KV still warm.
    history += " " + words("a", 100, 1200)
    status, second = await post(client, router, program_body("prog-a", history, kv_retention_ttl_seconds=0.3))
    assert status == 200
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 0.9 * first["usage"]["prompt_tokens"]

    # Long gap: the 0.3 s TTL expires and the Program pauses, releasing its capacity.
    d = await wait_until(
        lambda: diagnostics(client, router), lambda d: rank(d)["programs"][0]["state"] == "paused"
    )
    assert rank(d)["programs"][0]["pause_reason"] == "ttl_expired"
    assert rank(d)["router_estimated_used_tokens"] == 0
    target = rank(d)["target_id"]
    expired = router.registry.get_sample_value(
        PREFIX + "transitions_total", {"target": target, "reason": "ttl_expired"}
    )
    assert expired == 1

    # Another Program now takes the Rank's KV; the paused Program's prefix is evicted.
    status, _ = await post(client, router, program_body("prog-b", words("b", 2800)))
    assert status == 200
    history += " " + words("a", 20, 1300)
    status, third = await post(client, router, program_body("prog-a", history))
    assert status == 200
    usage = third["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] < 0.25 * usage["prompt_tokens"]


async def test_failing_metrics_falls_back_and_recovers_with_one_line_each(
    make_engine: EngineFactory,
    make_proxy: Any,
    make_router: RouterFactory,
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="progrouter")
    engine = await make_engine()
    proxy = await make_proxy(engine.url)
    router = await make_router([proxy.url], program_config())
    status, _ = await post(client, router, program_body("prog-a", words("a", 100)))
    assert status == 200

    def source(d: dict[str, Any]) -> str:
        value: str = rank(d)["capacity_accounting_source"]
        return value

    await wait_until(lambda: diagnostics(client, router), lambda d: source(d) == "backend_observation")
    caplog.clear()

    proxy.fail_metrics = True
    await wait_until(
        lambda: diagnostics(client, router), lambda d: source(d) == "router_ledger_stale_observation"
    )
    hits = proxy.metrics_hits
    await wait_until(lambda: asyncio.sleep(0, proxy.metrics_hits), lambda h: h >= hits + 5)
    proxy.fail_metrics = False
    await wait_until(lambda: diagnostics(client, router), lambda d: source(d) == "backend_observation")
    hits = proxy.metrics_hits
    await wait_until(lambda: asyncio.sleep(0, proxy.metrics_hits), lambda h: h >= hits + 5)

    def lines(text: str, level: int) -> list[str]:
        return [r.getMessage() for r in caplog.records if text in r.getMessage() and r.levelno == level]

    assert len(lines("event=capacity_observation_fallback", logging.WARNING)) == 1
    assert len(lines("event=capacity_observation_recovered", logging.INFO)) == 1
    assert len(lines("Program scheduling backend observation failed", logging.WARNING)) == 1
    assert len(lines("Program scheduling backend observation recovered", logging.INFO)) == 1
    assert "error=HTTP 500" in lines("Program scheduling backend observation failed", logging.WARNING)[0]


async def test_diagnostics_is_404_when_program_scheduling_is_off(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url], None)
    async with client.get(router.url + "/scheduling/diagnostics") as response:
        assert response.status == 404
    # And Program metadata is then just forwarded.
    status, _ = await post(client, router, program_body("prog-a", words("a", 10)))
    assert status == 200


async def test_identity_free_traffic_creates_no_program_state_and_no_polling(
    make_engine: EngineFactory, make_proxy: Any, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    proxy = await make_proxy(engine.url)
    router = await make_router([proxy.url], program_config())
    plain = {"model": MODEL, "messages": [{"role": "user", "content": words("p", 50)}], "max_tokens": 4}
    # x-session-id is a Program source only under enable_key "auto"; the default key ignores it.
    status, _ = await post(client, router, plain, headers={"x-session-id": "s1"})
    assert status == 200
    status, usage = await post(
        client, router, {**plain, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert status == 200 and usage is not None
    await asyncio.sleep(0.5)  # five polling intervals in which nothing may be polled
    d = await diagnostics(client, router)
    assert d["programs"] == 0
    assert d["retained_requests"] == 0
    assert d["ranks"] == []  # no model pool was ever registered, so there is nothing to observe
    assert d["token_estimation"] == []
    assert proxy.metrics_hits == 0
    # The control: the first Program request starts polling.
    status, _ = await post(client, router, program_body("prog-a", words("a", 10)))
    assert status == 200
    await wait_until(lambda: asyncio.sleep(0, proxy.metrics_hits), lambda h: h > 0)
