"""The dashboard's stream over loopback: bounded pushes, paging, the event feed, access, bad queries."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from integration.helpers import CAPACITY, program_body, wait_until, words
from progrouter.server.edge.drain import drain
from progrouter.server.runner import RunningRouter
from progrouter.server.state import STATE_KEY
from support.factories import EngineFactory, RouterFactory

pytestmark = pytest.mark.timeout(60)
CHAT = "/v1/chat/completions"
PROGRAM = {"token_capacity_per_dp_rank": CAPACITY, "metrics_interval_seconds": 0.1}


async def first_push(client: aiohttp.ClientSession, url: str, **headers: str) -> dict[str, Any]:
    async with client.get(url, headers=headers) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"] == "text/event-stream"
        line = await response.content.readline()
    assert line.startswith(b"data: ")
    push: dict[str, Any] = json.loads(line[6:])
    return push


async def post(client: aiohttp.ClientSession, router: RunningRouter, program: str, ttl: float) -> None:
    body = program_body(program, words("a", 200), kv_retention_ttl_seconds=ttl)
    async with client.post(router.url + CHAT, json=body) as response:
        assert response.status == 200


async def test_stream_pushes_ranks_a_page_and_events(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engines = [await make_engine(), await make_engine()]
    router = await make_router([e.url for e in engines], PROGRAM)
    for i in range(5):
        await post(client, router, f"prog-{i}", ttl=0.2)
    stream = router.url + "/dashboard/stream"
    push = await wait_until(
        lambda: first_push(client, stream + "?size=2&page=1"),
        lambda p: p["counts"]["retained"] == 5,
    )
    assert push["enabled"] and push["programs"] == 5
    assert sorted(r["base_url"] for r in push["ranks"]) == sorted(e.url for e in engines)
    page = push["page"]
    assert (page["index"], page["size"], page["pages"], page["total"]) == (1, 2, 3, 5)
    assert len(page["rows"]) == 2 and all(row["state"] == "retained" for row in page["rows"])
    diagnostics = await (await client.get(router.url + "/scheduling/diagnostics")).json()
    shown = {p["program"] for r in diagnostics["ranks"] for p in r["programs"]}
    assert {row["program"] for row in page["rows"]} <= shown  # ids exactly as the diagnostics show them
    names = [e["event"] for e in push["events"]]
    assert names.count("program_admit") == 5 and names.count("program_pause") == 5
    assert all("prog-" not in json.dumps(e) for e in push["events"])  # never a raw Program id
    running = await first_push(client, stream + "?state=running")
    assert running["page"]["total"] == 0 and running["page"]["state"] == "running"


async def test_stream_refuses_bad_queries_and_needs_the_admin_key(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url], PROGRAM, admin_api_key="admin-secret")
    stream = router.url + "/dashboard/stream"
    async with client.get(router.url + "/dashboard") as response:
        assert response.status == 401
    async with client.get(stream) as response:
        assert response.status == 401
    admin = {"Authorization": "Bearer admin-secret"}
    for query in ("?page=-1", "?size=x", "?state=sleeping"):
        async with client.get(stream + query, headers=admin) as response:
            assert response.status == 400, query
    async with client.get(router.url + "/dashboard", headers=admin) as response:
        assert response.status == 200 and "<table>" in await response.text()
    async with client.get(router.url + "/dashboard/secrets.txt", headers=admin) as response:
        assert response.status == 404


async def test_dashboard_can_live_on_the_prometheus_listener_only(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url], PROGRAM, prometheus_port=0, dashboard="prometheus")
    assert router.metrics_url is not None
    base = router.metrics_url.removesuffix("/metrics")
    async with client.get(router.url + "/dashboard") as response:
        assert response.status == 404
    push = await first_push(client, base + "/dashboard/stream")
    assert push["enabled"] and push["programs"] == 0


async def test_without_program_scheduling_the_stream_says_so(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url])
    push = await first_push(client, router.url + "/dashboard/stream")
    assert push["enabled"] is False


async def test_a_drain_ends_open_streams_instead_of_waiting_on_them(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url], PROGRAM)
    async with client.get(router.url + "/dashboard/stream") as response:
        assert (await response.content.readline()).startswith(b"data: ")
        assert await drain(router.app[STATE_KEY], 30.0)  # False would mean the stream held the drain
        assert await response.content.read() is not None  # the stream ends


async def test_the_feed_names_the_kv_size_to_configure_when_capacity_is_unset(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine(num_blocks=300, block_size=16)
    router = await make_router([engine.url], {**PROGRAM, "token_capacity_per_dp_rank": None})
    await post(client, router, "prog-a", ttl=0.2)

    def told(push: dict[str, Any]) -> list[dict[str, Any]]:
        return [e for e in push["events"] if e["event"] == "token_capacity_unset"]

    push = await wait_until(lambda: first_push(client, router.url + "/dashboard/stream"), told)
    (event,) = told(push)
    assert event["reported_kv_tokens_per_dp_rank"] == 300 * 16
    assert event["max_active_programs_per_target"] == 64 and event["base_url"] == engine.url
