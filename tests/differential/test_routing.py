"""Policy spread, session stickiness and DP-rank addressing: the same on progrouter and the wheel."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp

from progrouter.engine.server import RunningEngine
from support.factories import EngineFactory
from support.scripted_worker import Script

from .conftest import Launcher, WorkerFactory, flags
from .helpers import post, wait_for


async def test_round_robin_spreads_evenly(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    a, b = await workers(2)
    router = await launch(kind, flags([a.url, b.url]))
    statuses = [(await post(http, router.url)).status for _ in range(10)]
    assert statuses == [200] * 10
    assert (len(a.proxied), len(b.proxied)) == (5, 5)


async def test_consistent_hash_keeps_a_session_on_one_worker(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    pool = await workers(2)
    router = await launch(kind, flags((w.url for w in pool), policy="consistent_hash"))
    homes: dict[str, list[int]] = {}
    for session in ("s1", "s2", "s3", "s4", "s5", "s6"):
        for w in pool:
            w.reset()
        for _ in range(5):
            assert (await post(http, router.url, headers={"x-session-id": session})).status == 200
        homes[session] = sorted(len(w.proxied) for w in pool)
    assert homes == {s: [0, 5] for s in homes}


async def test_dp_rank_header_reaches_the_worker(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    a, b = await workers(2)
    router = await launch(kind, flags([a.url, b.url], "--intra-node-data-parallel-size", "2"))
    for _ in range(8):
        assert (await post(http, router.url)).status == 200
    ranks = Counter((w.url, s.headers.get("x-data-parallel-rank")) for w in (a, b) for s in w.proxied)
    assert ranks == {(w.url, r): 2 for w in (a, b) for r in ("0", "1")}


async def test_streams_a_chat_from_the_engine_emulator(
    kind: str, make_engine: EngineFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    engine: RunningEngine = await make_engine(time_scale=1000.0, data_parallel_size=2)
    router = await launch(kind, flags([engine.url], "--intra-node-data-parallel-size", "2"))
    body = {
        "model": engine.config.model_name,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 4,
        "stream": True,
    }
    async with http.post(router.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = [line for line in (await resp.text()).splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert len(events) >= 5  # one per generated token, then [DONE]


async def test_sticky_least_loaded_binds_new_sessions_to_the_idler_worker(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    pool = await workers(2, Script(stall=True))
    router = await launch(kind, flags((w.url for w in pool), policy="sticky_least_loaded"))

    def stalled() -> list[int]:
        return [w.stalled for w in pool]

    first = asyncio.ensure_future(post(http, router.url, headers={"x-session-id": "busy"}))
    await wait_for(lambda: sum(stalled()) == 1, 5.0, "the first session's request at a worker")
    home = stalled().index(1)
    second = asyncio.ensure_future(post(http, router.url, headers={"x-session-id": "new"}))
    await wait_for(lambda: sum(stalled()) == 2, 5.0, "the new session's request at a worker")
    assert stalled() == [1, 1]  # the new session went to the idle worker
    again = asyncio.ensure_future(post(http, router.url, headers={"x-session-id": "busy"}))
    await wait_for(lambda: sum(stalled()) == 3, 5.0, "the first session's second request")
    assert stalled()[home] == 2  # bound: it stays although its worker is busier
    for w in pool:
        w.release()
    assert [(await t).status for t in (first, second, again)] == [200, 200, 200]
