"""Inbound limits: 429 + Retry-After when the concurrency limit is reached, 413 over --max-payload-size."""

from __future__ import annotations

import asyncio

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


async def test_body_over_max_payload_size_is_413(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    (worker,) = await workers(1)
    router = await launch(kind, flags([worker.url], "--max-payload-size", "1000"))
    small = await post(http, router.url, body={**COMPLETION, "prompt": "x" * 800})
    large = await post(http, router.url, body={**COMPLETION, "prompt": "x" * 2000})
    assert (small.status, large.status) == (200, 413)
    assert len(worker.proxied) == 1
