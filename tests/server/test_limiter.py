"""The inbound limit: token bucket and queue (fake clock), then 429 / queue / 408 over loopback."""

from __future__ import annotations

import asyncio

import aiohttp

from progrouter.server.edge.limiter import InboundLimiter, TokenBucket
from progrouter.server.proxy import PROXY_KEY
from progrouter.server.runner import RunningRouter
from support.factories import RouterFactory

from .conftest import WorkerFactory
from .test_metrics import _samples


def test_token_bucket_takes_gives_back_and_refills() -> None:
    bucket = TokenBucket(capacity=2, rate=4.0, now=0.0)
    assert bucket.take(0.0) and bucket.take(0.0) and not bucket.take(0.0)
    assert not bucket.take(0.2) and bucket.take(0.25)
    bucket.give_back(0.25)
    bucket.give_back(0.25)
    bucket.give_back(10.0)
    assert bucket.tokens == 2  # never above capacity


ONE_SLOT = {"max_concurrent_requests": 1, "rate_limit_tokens_per_second": 1}


async def _held(client: aiohttp.ClientSession, url: str) -> aiohttp.ClientResponse:
    """A streamed request the worker holds until its ``release`` event is set."""
    return await client.post(url + "/v1/completions", json={"test_mode": "sse"})


async def test_full_without_queue_is_429_with_retry_after(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], queue_size=0, prometheus_port=0, **ONE_SLOT)
    first = await _held(client, router.url)
    async with client.post(router.url + "/v1/completions", json={}) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "1"
        assert (await resp.json())["error"]["code"] == 429
    async with client.get(router.url + "/health") as resp:
        assert resp.status == 200  # the limit covers proxied routes only
    worker.release.set()
    assert (await first.read()).endswith(b"[DONE]\n\n")
    async with client.post(router.url + "/v1/completions", json={}) as resp:
        assert resp.status == 200  # the token came back
    assert len(worker.requests) == 2
    assert router.metrics_url is not None
    async with client.get(router.metrics_url) as resp:
        text = await resp.text()
    assert _samples(text, "progrouter_inbound_rejections_total") == {(("reason", "queue_full"),): 1}
    errors = _samples(text, "vllm_router_request_errors_total")
    assert errors == {(("error_type", "queue_full"), ("route", "/v1/completions")): 1}


async def _queued(router: RunningRouter, n: int) -> None:
    limiter = router.app[PROXY_KEY].limiter
    while limiter.waiting != n:
        await asyncio.sleep(0.005)


async def test_a_queued_request_times_out_with_408(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], queue_timeout_secs=0.2, queue_size=1, **ONE_SLOT)
    first = await _held(client, router.url)
    async with client.post(router.url + "/v1/completions", json={}) as resp:
        assert resp.status == 408
        assert "queue" in (await resp.json())["error"]["message"]
    assert router.app[PROXY_KEY].limiter.waiting == 0
    worker.release.set()
    await first.read()
    assert len(worker.requests) == 1


async def test_waiters_past_the_queue_size_wait_too_and_run_as_tokens_come_back(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], queue_timeout_secs=30, queue_size=1, **ONE_SLOT)
    first = await _held(client, router.url)
    waiting = [asyncio.create_task(client.post(router.url + "/v1/completions", json={})) for _ in range(3)]
    await asyncio.wait_for(_queued(router, 3), timeout=5)  # three waiters for one queue place, none refused
    worker.release.set()
    await first.read()
    for task in waiting:
        async with await asyncio.wait_for(task, timeout=5) as resp:
            assert resp.status == 200
    assert len(worker.requests) == 4


async def test_refilled_tokens_go_to_arrivals_and_waiters_move_when_a_token_is_given_back() -> None:
    now = [0.0]
    limiter = InboundLimiter(capacity=1, rate=1.0, queue_size=1, queue_timeout=30, clock=lambda: now[0])
    assert limiter.try_take()
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    assert limiter.waiting == 1
    now[0] = 5.0  # the bucket has refilled: an arrival takes the token, the waiter still waits
    await asyncio.sleep(0)
    assert limiter.try_take() and not waiter.done()
    limiter.release()  # a request finished: its token goes to the waiter
    await asyncio.wait_for(waiter, timeout=5)
    assert limiter.waiting == 0
