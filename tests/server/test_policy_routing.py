"""Native policies end to end: which worker actually receives each request."""

from __future__ import annotations

import asyncio

import aiohttp

from support.factories import RouterFactory

from .conftest import WorkerFactory
from .workers import FakeWorker


async def _who(
    client: aiohttp.ClientSession, url: str, *, json: object, headers: dict[str, str] | None = None
) -> str:
    async with client.post(url + "/v1/chat/completions", json=json, headers=headers) as resp:
        assert resp.status == 200
        return str(resp.headers["X-Worker"])


async def test_consistent_hash_sticky_and_stable_across_worker_order(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    workers = [await make_worker() for _ in range(3)]
    urls = [w.url for w in workers]
    r1 = await make_router(urls, policy="consistent_hash")
    r2 = await make_router(list(reversed(urls)), policy="consistent_hash")
    placements = {}
    for i in range(30):
        headers = {"x-session-id": f"session-{i}"}
        placements[i] = await _who(client, r1.url, json={"messages": []}, headers=headers)
        assert (
            await _who(
                client, r1.url, json={"messages": [{"role": "user", "content": "more"}]}, headers=headers
            )
            == placements[i]
        )
        assert await _who(client, r2.url, json={"messages": []}, headers=headers) == placements[i]
    assert len(set(placements.values())) == 3


async def test_round_robin_distributes_evenly(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    workers = [await make_worker() for _ in range(3)]
    router = await make_router([w.url for w in workers], policy="round_robin")
    for _ in range(9):
        await _who(client, router.url, json={})
    assert [len(w.requests) for w in workers] == [3, 3, 3]


async def test_power_of_two_avoids_the_worker_with_requests_in_flight(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    busy, idle = await make_worker(), await make_worker()
    router = await make_router([busy.url, idle.url], policy="power_of_two")
    # One request that never finishes lands on some worker; with two targets, power_of_two compares both
    # every time, so every later request must go to the other one.
    slow = asyncio.create_task(client.post(router.url + "/v1/completions", json={"test_mode": "slow"}))
    while not (busy.requests or idle.requests):
        await asyncio.sleep(0.005)
    loaded: FakeWorker = busy if busy.requests else idle
    other = idle if loaded is busy else busy
    for _ in range(10):
        assert await _who(client, router.url, json={}) == other.name
    slow.cancel()


async def test_cache_aware_keeps_a_conversation_on_one_worker(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    workers = [await make_worker() for _ in range(2)]
    router = await make_router([w.url for w in workers], policy="cache_aware", cache_threshold=0.5)
    history = [{"role": "system", "content": "You are a helpful agent with a long system prompt. " * 4}]
    homes = set()
    for turn in range(6):
        history.append({"role": "user", "content": f"turn {turn}"})
        homes.add(await _who(client, router.url, json={"messages": history}))
        history.append({"role": "assistant", "content": f"answer {turn}"})
    assert len(homes) == 1
    # a different conversation starts on the other (emptier) worker
    assert (
        await _who(client, router.url, json={"messages": [{"role": "user", "content": "new"}]}) not in homes
    )
