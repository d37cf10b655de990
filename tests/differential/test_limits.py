"""Inbound limits: 429 + Retry-After without a queue, 408 for a waiter past its queue timeout, waiters past
the queue size held rather than refused, 413 over --max-payload-size."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp

from support.scripted_worker import Script

from .conftest import Launcher, WorkerFactory, flags
from .helpers import COMPLETION, post, wait_for


async def test_full_router_answers_429_with_retry_after(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    (worker,) = await workers(1)
    limits = ["--max-concurrent-requests", "1", "--queue-size", "0"]
    router = await launch(kind, flags([worker.url], *limits))
    worker.reset(Script(stall=True))
    first = asyncio.ensure_future(post(http, router.url))
    await wait_for(lambda: worker.stalled == 1, 5.0, "the first request to reach the worker")
    refused = await post(http, router.url)
    assert refused.status == 429
    assert int(refused.headers["retry-after"]) >= 1
    assert len(worker.proxied) == 1  # the refused request never reached a worker
    worker.release()
    assert (await first).status == 200
    assert (await post(http, router.url)).status == 200  # the slot came back


QUEUED = ["--max-concurrent-requests", "1", "--queue-size", "1"]


async def test_requests_queued_behind_a_slow_request_time_out_with_408(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    """A worker that takes longer than the queue timeout, four requests at once: the slot's refill does not
    admit a waiter, and no waiter is refused for the queue being full — each gets 408 at its timeout.

    The wheel's bucket refills its one token (``--rate-limit-tokens-per-second`` defaults to the
    concurrency, 1/s) at the very second its waiters time out, and now and then its queue hands that token
    to a waiter first, so that run ends [200, 200, 408, 408]. progrouter gives a refill to arrivals only,
    so its outcome is exact; the wheel's is checked for what holds in both of its outcomes: no 429 (the
    queue holds rather than refuses), the others 408, each 200 proxied once."""
    (worker,) = await workers(1)
    router = await launch(kind, flags([worker.url], *QUEUED, "--queue-timeout-secs", "1"))
    worker.reset(Script(stall=True))  # held until the waiters are answered (a worker that takes 2 s or more)
    requests = [asyncio.ensure_future(post(http, router.url)) for _ in range(4)]
    settled = lambda: sum(r.done() for r in requests) + worker.stalled == 4  # noqa: E731
    await wait_for(settled, 20.0, "every request answered or at the worker")
    worker.release()
    statuses = Counter([(await request).status for request in requests])
    if kind == "upstream":
        assert statuses in (Counter({200: 1, 408: 3}), Counter({200: 2, 408: 2})), statuses
        assert len(worker.proxied) == statuses[200]
        return
    assert statuses == Counter({200: 1, 408: 3})
    assert len(worker.proxied) == 1


async def test_waiters_past_the_queue_size_are_served_when_the_slot_comes_back(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    (worker,) = await workers(1)
    router = await launch(kind, flags([worker.url], *QUEUED, "--queue-timeout-secs", "30"))
    worker.reset(Script(stall=True))
    first = asyncio.ensure_future(post(http, router.url))
    await wait_for(lambda: worker.stalled == 1, 5.0, "the first request to reach the worker")
    waiting = [asyncio.ensure_future(post(http, router.url)) for _ in range(3)]
    await asyncio.sleep(0.5)  # let the three reach the router's queue (one place) before the slot comes back
    assert not any(request.done() for request in waiting)  # none refused for the queue being full
    worker.release()
    assert [(await request).status for request in [first, *waiting]] == [200] * 4
    assert len(worker.proxied) == 4


async def test_body_over_max_payload_size_is_413(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    (worker,) = await workers(1)
    router = await launch(kind, flags([worker.url], "--max-payload-size", "1000"))
    small = await post(http, router.url, body={**COMPLETION, "prompt": "x" * 800})
    large = await post(http, router.url, body={**COMPLETION, "prompt": "x" * 2000})
    assert (small.status, large.status) == (200, 413)
    assert len(worker.proxied) == 1
