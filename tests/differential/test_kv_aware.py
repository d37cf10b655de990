"""kv_aware on progrouter and the wheel, same flags, same KV events: where the outcome is deterministic
(temperature 0), the same worker is chosen. The events come from a publisher in vLLM's current wire layout
(tagged maps, as vLLM >= 0.28 sends; the wheel reads no other), describing what each worker holds."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio

from support.kv_events import free_port_pair
from support.scripted_worker import ScriptedWorker

from .conftest import Launcher, WorkerFactory, flags
from .helpers import post, wait_for

BS = 16
P = list(range(1000, 1000 + 4 * BS))  # the prefix a scenario is about
Q = list(range(5000, 5000 + 2 * BS))  # the probe prefix: announced in the same batch as P


def stored(tokens: list[int], first_hash: int) -> dict[str, Any]:
    """vLLM's BlockStored as a tagged map (hashes are the engine's own; routers key blocks by token ids)."""
    n = len(tokens) // BS
    return {
        "type": "BlockStored",
        "block_hashes": list(range(first_hash, first_hash + n)),
        "parent_block_hash": None,
        "token_ids": tokens,
        "block_size": BS,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }


class Publisher:
    """One worker's KV event socket: republishes its state every 20 ms (new sequence numbers), so a router
    that connects late still hears it; a repeated BlockStored of known hashes changes nothing."""

    def __init__(self, ctx: zmq.asyncio.Context) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port_pair()}"
        self.sock = ctx.socket(zmq.PUB)
        self.sock.bind(self.endpoint)
        self.events: list[dict[str, Any]] = []
        self.seq = 0

    async def run(self) -> None:
        while True:
            payload = msgpack.packb([time.time(), self.events, None])
            await self.sock.send_multipart([b"", self.seq.to_bytes(8, "big", signed=True), payload])
            self.seq += 1
            await asyncio.sleep(0.02)


Publishers = Callable[[int], Awaitable[list[Publisher]]]


@pytest.fixture
async def publishers() -> AsyncIterator[Publishers]:
    ctx = zmq.asyncio.Context()
    tasks: list[asyncio.Task[None]] = []

    async def make(n: int) -> list[Publisher]:
        pubs = [Publisher(ctx) for _ in range(n)]
        tasks.extend(asyncio.create_task(p.run()) for p in pubs)
        return pubs

    yield make
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    ctx.destroy(linger=0)


def kv_flags(workers: list[ScriptedWorker], pubs: list[Publisher], *extra: str) -> list[str]:
    sources = [
        arg
        for w, p in zip(workers, pubs, strict=True)
        for arg in ("--kv-event-source", f"{w.url}={p.endpoint}")
    ]
    return flags(
        [w.url for w in workers],
        *sources,
        *("--kv-event-model", "scripted", "--kv-event-block-size", str(BS), "--router-temperature", "0"),
        *extra,
        policy="kv_aware",
    )


def body(tokens: list[int]) -> dict[str, Any]:
    return {"model": "scripted", "prompt": tokens, "max_tokens": 1}


async def heard(http: aiohttp.ClientSession, url: str, holder: ScriptedWorker) -> None:
    """Until a probe extending Q lands on ``holder``: the batch announcing P and Q has been applied."""
    i = 0

    async def probe() -> bool:
        nonlocal i
        i += 1
        before = len(holder.proxied)
        assert (await post(http, url, body=body([*Q, 1, i]))).status == 200
        return len(holder.proxied) > before

    deadline = time.monotonic() + 20.0
    while not await probe():
        assert time.monotonic() < deadline, "the router never routed by the announced blocks"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    ("held_by_a", "held_by_b", "expected"),
    [
        ([], [stored(P, 100), stored(Q, 200)], (0, 5)),  # only B holds P
        ([stored(P, 100), stored(Q, 200)], [stored(P[: 2 * BS], 300)], (5, 0)),  # A holds more of P
    ],
    ids=["holder", "longer-prefix"],
)
async def test_a_prefix_goes_to_the_worker_holding_most_of_it(
    kind: str,
    workers: WorkerFactory,
    launch: Launcher,
    publishers: Publishers,
    http: aiohttp.ClientSession,
    held_by_a: list[dict[str, Any]],
    held_by_b: list[dict[str, Any]],
    expected: tuple[int, int],
) -> None:
    a, b = await workers(2)
    pa, pb = await publishers(2)
    pa.events, pb.events = held_by_a, held_by_b
    router = await launch(kind, kv_flags([a, b], [pa, pb]))
    await heard(http, router.url, b if expected[1] else a)  # Q is announced with the larger holding
    a.reset(), b.reset()
    for i in range(5):
        assert (await post(http, router.url, body=body([*P, 7, i]))).status == 200
    assert (len(a.proxied), len(b.proxied)) == expected


async def test_a_cold_prompt_goes_to_the_less_loaded_worker(
    kind: str, workers: WorkerFactory, launch: Launcher, publishers: Publishers, http: aiohttp.ClientSession
) -> None:
    a, b = await workers(2)
    pa, pb = await publishers(2)
    pb.events = [stored(Q, 200)]
    router = await launch(kind, kv_flags([a, b], [pa, pb]))
    await heard(http, router.url, b)
    a.reset(), b.reset()
    a.script.stall = b.script.stall = True
    first = asyncio.create_task(post(http, router.url, body=body(list(range(7000, 7000 + 3 * BS)))))
    await wait_for(lambda: a.stalled + b.stalled == 1, 10.0, "the first cold request to reach a worker")
    busy, idle = (a, b) if a.stalled else (b, a)
    second = asyncio.create_task(post(http, router.url, body=body(list(range(8000, 8000 + 3 * BS)))))
    await wait_for(lambda: idle.stalled == 1, 10.0, "the second cold request on the idle worker")
    assert busy.stalled == 1
    a.release(), b.release()
    assert [(await first).status, (await second).status] == [200, 200]


@pytest.mark.parametrize("ttl", [None, "60"])
async def test_session_affinity_keeps_a_session_where_it_started(
    kind: str,
    workers: WorkerFactory,
    launch: Launcher,
    publishers: Publishers,
    http: aiohttp.ClientSession,
    ttl: str | None,
) -> None:
    """Session s1 starts on A (B is busy); then its prompt extends B's prefix: with the TTL it stays on A."""
    a, b = await workers(2)
    pa, pb = await publishers(2)
    pb.events = [stored(P, 100), stored(Q, 200)]
    extra = ("--kv-aware-session-affinity-ttl-secs", ttl) if ttl else ()
    router = await launch(kind, kv_flags([a, b], [pa, pb], *extra))
    await heard(http, router.url, b)
    a.reset(), b.reset()
    b.script.stall = True
    busy = asyncio.create_task(post(http, router.url, body=body([*P, 1])))
    await wait_for(lambda: b.stalled == 1, 10.0, "a request holding B")
    session = {"x-session-id": "s1"}
    assert (
        await post(http, router.url, body=body(list(range(9000, 9000 + 2 * BS))), headers=session)
    ).status == 200
    assert len(a.proxied) == 1  # B was busy: the session started on A
    b.release()
    assert (await busy).status == 200
    assert (await post(http, router.url, body=body([*P, 2]), headers=session)).status == 200
    assert (len(a.proxied), len(b.proxied)) == ((2, 1) if ttl else (1, 2))
