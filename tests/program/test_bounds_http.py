"""The Program bounds seen over HTTP: router and emulator on loopback."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from progrouter.server.runner import RunningRouter
from support.factories import EngineFactory, RouterFactory


def _body(task: str, **context: Any) -> dict[str, Any]:
    return {
        "model": "progrouter-emulated",
        "messages": [{"role": "user", "content": f"hello from {task}"}],
        "max_tokens": 4,
        "vllm_xargs": {"agentic_context": json.dumps({"task_id": task, **context})},
    }


async def _diagnostics(client: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with client.get(url + "/scheduling/diagnostics") as resp:
        assert resp.status == 200
        result: dict[str, Any] = await resp.json()
        return result


async def _until(client: aiohttp.ClientSession, url: str, retained: int) -> None:
    deadline = time.monotonic() + 20.0
    while (await _diagnostics(client, url))["retained_requests"] != retained:
        assert time.monotonic() < deadline, f"never {retained} retained"
        await asyncio.sleep(0.02)


async def _rejections(client: aiohttp.ClientSession, router: RunningRouter) -> dict[str, float]:
    """``progrouter_program_rejections_total`` by reason, from the router's Prometheus listener."""
    assert router.metrics_url is not None
    async with client.get(router.metrics_url) as resp:
        text = await resp.text()
    return {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "progrouter_program_rejections"
        for s in family.samples
        if s.name.endswith("_total")
    }


REASONS = ("pool_full", "queue_timeout", "invalid_identity", "no_targets", "draining")
NO_REJECTIONS = dict.fromkeys(REASONS, 0.0)


async def test_a_full_pool_answers_429_with_retry_after(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    bounds = {"max_active_programs_per_target": 1, "max_pooled_requests": 2}
    router = await make_router([engine.url], bounds, prometheus_port=0)
    url = router.url + "/v1/chat/completions"
    assert await _rejections(client, router) == NO_REJECTIONS  # every reason is exposed from the start

    async def post(task: str, **context: Any) -> int:
        async with client.post(url, json=_body(task, **context)) as resp:
            await resp.read()
            return resp.status

    assert await post("holder", kv_retention_ttl=4) == 200  # keeps the only slot for 4 s
    waiters = [asyncio.create_task(post(f"w{i}")) for i in range(2)]
    await _until(client, router.url, 2)
    async with client.post(url, json=_body("late")) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "1"
        assert "pool is full" in (await resp.json())["error"]["message"]
    assert (await _diagnostics(client, router.url))["retained_requests"] == 2  # the 429 changed nothing
    assert await _rejections(client, router) == {**NO_REJECTIONS, "pool_full": 1.0}
    assert await asyncio.gather(*waiters) == [200, 200]
    assert await post("late") == 200  # room again
    async with client.post(url, json=_body("bad", expected_resume="yes")) as resp:
        assert resp.status == 400
    assert await _rejections(client, router) == {**NO_REJECTIONS, "pool_full": 1.0, "invalid_identity": 1.0}


async def test_a_queue_timeout_is_counted_apart_from_a_full_pool(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url], {"max_active_programs_per_target": 1}, prometheus_port=0)
    url = router.url + "/v1/chat/completions"

    async def post(task: str, **context: Any) -> aiohttp.ClientResponse:
        async with client.post(url, json=_body(task, **context)) as resp:
            await resp.read()
            return resp

    assert (await post("holder", kv_retention_ttl=10)).status == 200  # the only slot, for 10 s
    # its deadline forces it in past the limit, and it stays (the Rank's one forced resume) for 10 s
    assert (await post("forced", kv_retention_ttl=10, deadline=0.2)).status == 200
    late = await post("late", deadline=0.3)  # no second forced resume: its deadline passes in the pool
    assert late.status == 429 and late.headers["Retry-After"] == "1"
    assert await _rejections(client, router) == {**NO_REJECTIONS, "queue_timeout": 1.0}


async def test_fresh_model_names_share_one_pool_past_the_bound(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url], {"max_model_pools": 2})
    for i in range(20):
        body = {**_body(f"t{i}"), "model": f"no-such-model-{i}"}
        async with client.post(router.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 404  # the worker's answer for a model it does not serve
    # two named pools, then every fresh name shares program:all
    assert (await _diagnostics(client, router.url))["model_pools"] == 3
    async with client.post(router.url + "/v1/chat/completions", json=_body("served")) as resp:
        assert resp.status == 200


async def test_diagnostics_pages_and_refuses_a_bad_page(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url], {})
    for i in range(5):
        async with client.post(router.url + "/v1/chat/completions", json=_body(f"task-{i}")) as resp:
            assert resp.status == 200
    async with client.get(router.url + "/scheduling/diagnostics?offset=1&limit=2") as resp:
        assert resp.status == 200
        snapshot = await resp.json()
        text = json.dumps(snapshot)
    assert snapshot["program_page"] == {"offset": 1, "limit": 2, "total": 5}
    assert sum(len(rank["programs"]) for rank in snapshot["ranks"]) == 2
    assert "task-" not in text  # raw ids are never shown
    for bad in ("limit=-1", "offset=x", "limit=1e3"):
        async with client.get(router.url + "/scheduling/diagnostics?" + bad) as resp:
            assert resp.status == 400
            assert "non-negative integer" in (await resp.json())["error"]["message"]
