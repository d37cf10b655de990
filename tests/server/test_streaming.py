"""SSE pass-through: chunks flow before the stream ends; a client disconnect reaches the worker."""

from __future__ import annotations

import asyncio

import aiohttp

from support.factories import RouterFactory

from .conftest import WorkerFactory


async def test_first_chunk_arrives_before_the_stream_ends(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url])
    async with client.post(router.url + "/v1/chat/completions", json={"test_mode": "sse"}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        assert resp.headers["X-Worker"] == "w0"
        # The worker holds the rest of the stream until `release`: this read can only finish if the router
        # relayed the first chunk on its own.
        first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), timeout=5)
        assert first == b'data: {"n": 1}\n\n'
        assert not worker.release.is_set()
        worker.release.set()
        rest = await resp.content.read()
    assert rest == b'data: {"n": 2}\n\ndata: [DONE]\n\n'


async def test_client_disconnect_mid_stream_aborts_the_worker_request(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url])
    resp = await client.post(router.url + "/v1/chat/completions", json={"test_mode": "sse"})
    assert await resp.content.readuntil(b"\n\n") == b'data: {"n": 1}\n\n'
    resp.close()  # drop the connection while the worker is still streaming
    await asyncio.wait_for(worker.cancelled.wait(), timeout=5)


async def test_client_disconnect_while_waiting_aborts_the_worker_request(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url])
    task = asyncio.create_task(client.post(router.url + "/v1/completions", json={"test_mode": "slow"}))
    await asyncio.wait_for(worker.received.wait(), timeout=5)
    task.cancel()  # the client gives up before any response header
    await asyncio.wait_for(worker.cancelled.wait(), timeout=5)
    # the router is still fine afterwards
    async with client.post(router.url + "/v1/completions", json={}) as resp:
        assert resp.status == 200


async def test_stream_breaking_midway_breaks_the_client_stream_without_retry(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    w0, w1 = await make_worker(), await make_worker()
    router = await make_router(sorted([w0.url, w1.url]), retry_max_retries=3)
    first = w0 if w0.url < w1.url else w1
    other = w1 if first is w0 else w0
    async with client.post(router.url + "/v1/chat/completions", json={"test_mode": "break"}) as resp:
        assert resp.status == 200
        received = b""
        try:
            async for chunk in resp.content.iter_any():
                received += chunk
            broke = False
        except aiohttp.ClientPayloadError:
            broke = True
    assert received == b'data: {"n": 1}\n\n'
    assert broke  # an incomplete chunked body, not a clean end the client would take for success
    assert len(first.requests) == 1 and other.requests == []  # streamed bytes forbid a retry


async def test_request_timeout_bounds_a_stream_too(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], request_timeout_secs=0.3)
    async with client.post(router.url + "/v1/chat/completions", json={"test_mode": "sse"}) as resp:
        assert resp.status == 200
        assert await resp.content.readuntil(b"\n\n") == b'data: {"n": 1}\n\n'
        try:
            await resp.content.read()  # the worker never sends the rest
            broke = False
        except aiohttp.ClientPayloadError:
            broke = True
    assert broke
    await asyncio.wait_for(worker.cancelled.wait(), timeout=5)
