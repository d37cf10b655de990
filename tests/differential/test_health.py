"""Health checks take a worker out of routing and bring it back; /health and /readiness say so."""

from __future__ import annotations

import asyncio

import aiohttp

from support.scripted_worker import Script

from .conftest import Launcher, WorkerFactory, flags
from .helpers import get, post, within

CHECKS = ["--health-check-interval-secs", "1", "--health-failure-threshold", "1"]
CHECKS += ["--health-success-threshold", "1"]


async def test_unhealthy_worker_leaves_routing_and_returns(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    a, b = await workers(2)
    router = await launch(kind, flags([a.url, b.url], *CHECKS))

    async def until(path: str, status: int, what: str) -> None:
        async def poll() -> None:
            while (await get(http, router.url + path)).status != status:
                await asyncio.sleep(0.05)

        await within(poll(), 6.0, what)

    a.reset(Script(health_status=503))
    await until("/health", 503, "/health to report the unhealthy worker")
    assert (await get(http, router.url + "/readiness")).status == 200
    a.reset(Script(health_status=503))  # fresh counts, still unhealthy
    b.reset()
    assert [(await post(http, router.url)).status for _ in range(4)] == [200] * 4
    assert (len(a.proxied), len(b.proxied)) == (0, 4)

    b.reset(Script(health_status=503))
    await until("/readiness", 503, "/readiness 503 with no healthy worker")
    assert (await post(http, router.url)).status == 503
    assert (len(a.proxied), len(b.proxied)) == (0, 0)

    a.reset()
    await until("/readiness", 200, "the worker to come back")
    assert (await post(http, router.url)).status == 200
    assert len(a.proxied) == 1
