"""Operations with Program scheduling on, over loopback: worker add/remove at runtime and the drain."""

from __future__ import annotations

import asyncio
import json
import signal
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from progrouter.server.edge.drain import drain
from support.factories import EngineFactory, RouterFactory
from support.serve import serving

from .helpers import program_body, programs, wait_until, words
from .test_program_scheduling import diagnostics, post, program_config, rank

pytestmark = pytest.mark.timeout(60)


async def test_removing_a_worker_fails_its_programs_over_and_adding_one_offers_its_ranks(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engines = [await make_engine(), await make_engine()]
    router = await make_router(
        [e.url for e in engines],
        program_config(),
        worker_startup_timeout_secs=5,
        worker_startup_check_interval=0.1,
    )
    status, _ = await post(
        client, router, program_body("prog-r", words("r", 300), kv_retention_ttl_seconds=600)
    )
    assert status == 200
    [program] = programs(await diagnostics(client, router))
    home = program["last_target"]
    survivor = next(e.url for e in engines if e.url != home)
    assert program["state"] == "active"

    async with client.post(router.url + "/remove_worker", params={"url": home}) as resp:
        assert resp.status == 200
    d = await diagnostics(client, router)
    assert [r["target_id"] for r in d["ranks"]] == [survivor]
    [program] = programs(d)
    assert program["state"] == "paused" and program["last_target"] == survivor
    assert rank(d)["router_estimated_used_tokens"] == 0 and rank(d)["router_ledger_tokens"] == 0

    status, _ = await post(client, router, program_body("prog-r", words("r", 300) + " " + words("s", 20)))
    assert status == 200
    assert [p["last_target"] for p in programs(await diagnostics(client, router))] == [survivor]

    async with client.post(router.url + "/add_worker", params={"url": home}) as resp:
        assert resp.status == 200
    d = await diagnostics(client, router)
    assert sorted(r["target_id"] for r in d["ranks"]) == sorted([home, survivor])
    # The added Rank takes new Programs: fresh Programs are hashed over both Ranks' ring (whose points
    # depend on the run's random ports), so send them until one lands on it. Six alone all missed it in
    # about one run in 64; forty all miss it with odds of about 2**-40 unless it is never offered.
    for i in range(40):
        status, _ = await post(client, router, program_body(f"prog-n{i}", words("n", 50, start=i)))
        assert status == 200
        d = await diagnostics(client, router)
        if {p["last_target"] for p in programs(d)} == {home, survivor}:
            break
    assert {p["last_target"] for p in programs(d)} == {home, survivor}


async def _fill_the_rank(client: aiohttp.ClientSession, router: Any) -> list[asyncio.Task[tuple[int, Any]]]:
    """Two running Programs that fill the (stalled) engine's Rank: a third one is pooled."""
    running = [
        asyncio.create_task(post(client, router, program_body(f"prog-{x}", words(x, 1000)))) for x in "ab"
    ]
    await wait_until(
        lambda: diagnostics(client, router), lambda d: rank(d).get("router_active_reasoning_programs") == 2
    )
    return running


async def test_drain_answers_pooled_program_requests_503_and_lets_running_ones_finish(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url], program_config(admission_waiting_request_threshold=0))
    engine.server.set_fault(0, "stall")
    running = await _fill_the_rank(client, router)
    body = program_body("prog-c", words("c", 1000))
    async with aiohttp.ClientSession() as other:
        pooled = asyncio.create_task(other.post(router.url + "/v1/chat/completions", json=body))
        await wait_until(lambda: diagnostics(client, router), lambda d: d["retained_requests"] == 1)
        draining = asyncio.create_task(drain(router.state, 30))
        async with await pooled as resp:
            assert resp.status == 503 and resp.headers["Retry-After"] == "1"
            assert "shutting down" in (await resp.json())["error"]["message"]
    async with client.get(router.url + "/readiness") as resp:
        assert resp.status == 503 and (await resp.json())["reason"] == "router is shutting down"
    async with client.post(router.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 503 and resp.headers["Retry-After"] == "1"
    async with client.get(router.url + "/liveness") as resp:
        assert resp.status == 200
    assert not draining.done()  # the two forwarded requests are still running

    engine.server.set_fault(0, "none")
    assert [status for status, _ in await asyncio.gather(*running)] == [200, 200]
    assert await asyncio.wait_for(draining, 10) is True
    d = await diagnostics(client, router)
    assert d["retained_requests"] == 0
    assert rank(d)["router_in_flight_requests"] == 0
    assert rank(d)["router_estimated_used_tokens"] == 0


async def test_drain_gives_up_at_its_deadline(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url])
    engine.server.set_fault(0, "stall")
    stuck = asyncio.create_task(
        client.post(router.url + "/v1/completions", json={"prompt": "x", "model": "emu"})
    )
    await wait_until(lambda: asyncio.sleep(0, router.state.active_requests), lambda n: n == 1)
    assert await drain(router.state, 0.2) is False
    stuck.cancel()


async def test_serve_on_sigterm_answers_pooled_program_requests_503_and_exits_0(
    make_engine: EngineFactory, client: aiohttp.ClientSession
) -> None:
    """The same drain, through a real `progrouter serve` process and its signal handler."""
    engine = await make_engine()
    engine.server.set_fault(0, "stall")
    settings = json.dumps(program_config(admission_waiting_request_threshold=0))
    async with serving() as serve:
        proc, url = await serve(
            "--worker-urls", engine.url, "--enable-program-scheduling", "--program-scheduling-config-json",
            settings, "--worker-startup-check-interval", "0.1", "--drain-timeout-secs", "60",
        )  # fmt: skip
        router = SimpleNamespace(url=url)  # what the integration helpers read of a router

        async def snapshot() -> dict[str, Any]:
            return await diagnostics(client, router)

        await wait_until(lambda: _status(client, url + "/readiness"), lambda s: s == 200)
        running = await _fill_the_rank(client, router)
        pooled = asyncio.create_task(
            client.post(url + "/v1/chat/completions", json=program_body("prog-c", words("c", 1000)))
        )
        await wait_until(snapshot, lambda d: d["retained_requests"] == 1)
        proc.send_signal(signal.SIGTERM)
        async with await pooled as resp:
            assert resp.status == 503 and resp.headers["Retry-After"] == "1"
        assert await _status(client, url + "/readiness") == 503
        d = await snapshot()
        assert d["retained_requests"] == 0 and proc.returncode is None  # still draining the two
        engine.server.set_fault(0, "none")
        assert [status for status, _ in await asyncio.gather(*running)] == [200, 200]
        assert await asyncio.wait_for(proc.wait(), 30) == 0


async def _status(client: aiohttp.ClientSession, url: str) -> int:
    async with client.get(url) as resp:
        return resp.status
