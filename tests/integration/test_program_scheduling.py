"""Router + emulator engine + Program scheduling over loopback: observation and its fallback, the diagnostics
route, identity-free traffic. The scenarios both shells share (pool, usage, TTL, errors, failover) run once
per shell in tests/epp/test_program_scenarios.py."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from progrouter.server.runner import RunningRouter
from support.factories import EngineFactory, RouterFactory
from support.loopback import serve_app

from .helpers import (
    CAPACITY,
    MODEL,
    program_body,
    programs,
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
    # Observations go stale after a few polling intervals; at 0.1 s a loaded host's late poll alone made
    # one go stale (a second fallback and recovery). 0.5 s keeps the test about flapping, not scheduling.
    router = await make_router([proxy.url], program_config(metrics_interval_seconds=0.5))
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


async def test_a_stream_the_client_leaves_after_done_completes_its_request(
    make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    """A worker ends a stream with ``data: [DONE]`` and then the stream's end (vLLM writes them apart); a
    client that hangs up between the two got the whole answer, so the Program's request completed — it
    must not count as failed (real vLLM showed it: the Program was paused as ``request_failed``)."""
    stream_end = asyncio.Event()

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        usage = {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101}
        await stream.write(b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n')
        await stream.write(b'data: {"choices":[],"usage":' + json.dumps(usage).encode() + b"}\n\n")
        await stream.write(b"data: [DONE]\n\n")
        await stream_end.wait()  # the end comes only after the client left (the router cancels this)
        await stream.write_eof()
        return stream

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post(CHAT, chat)
    app.router.add_get("/health", health)
    runner, url = await serve_app(app)
    try:
        router = await make_router([url], program_config())
        body = program_body("prog-a", words("a", 100), stream=True)
        async with client.post(router.url + CHAT, json=body) as response:
            assert response.status == 200
            async for line in response.content:
                if line.strip() == b"data: [DONE]":
                    break  # leaving unread the stream's end: aiohttp closes this connection
        d = await wait_until(
            lambda: diagnostics(client, router),
            lambda d: bool(programs(d)) and programs(d)[0]["completed_requests"] == 1,
        )
        assert programs(d)[0]["pause_reason"] != "request_failed"
    finally:
        stream_end.set()
        await runner.cleanup()


@pytest.mark.parametrize("capacity", [None, CAPACITY], ids=["unset", "configured"])
async def test_an_unset_token_capacity_names_the_kv_size_vllm_reports_once(
    make_engine: EngineFactory,
    make_proxy: Any,
    make_router: RouterFactory,
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    capacity: int | None,
) -> None:
    caplog.set_level(logging.INFO, logger="progrouter")
    engine = await make_engine(data_parallel_size=2, num_blocks=250, block_size=16)
    proxy = await make_proxy(engine.url)  # counts the router's scrapes
    config = {"token_capacity_per_dp_rank": capacity, "metrics_interval_seconds": 0.1}
    router = await make_router([proxy.url], config, intra_node_data_parallel_size=2)
    status, _ = await post(client, router, program_body("prog-a", words("a", 20)))  # polling starts
    assert status == 200
    await wait_until(lambda: asyncio.sleep(0, proxy.metrics_hits), lambda h: h >= 6)

    def told() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if "event=token_capacity_unset" in r.getMessage() and r.levelno == logging.WARNING
        ]

    if capacity is not None:
        assert told() == []
        return
    (line,) = told()
    assert "reported_kv_tokens_per_dp_rank=4000" in line  # 250 blocks × 16 tokens, each Rank
    assert "max_active_programs_per_target=64" in line
    assert f"base_url={proxy.url}" in line
    assert "prog-a" not in line  # no Program ID in a warning
