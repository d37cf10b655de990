from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from progrouter.config import RouterConfig
from progrouter.server.runner import RunningRouter, start_router

from .workers import FakeWorker

RouterFactory = Callable[..., Awaitable[RunningRouter]]
WorkerFactory = Callable[..., Awaitable[FakeWorker]]


@pytest.fixture
async def make_worker() -> AsyncIterator[WorkerFactory]:
    started: list[FakeWorker] = []

    async def make(name: str | None = None, **kwargs: Any) -> FakeWorker:
        worker = await FakeWorker(name or f"w{len(started)}", **kwargs).start()
        started.append(worker)
        return worker

    yield make
    for w in started:
        w.release.set()
        await w.stop()


@pytest.fixture
async def make_router() -> AsyncIterator[RouterFactory]:
    started: list[RunningRouter] = []

    async def make(worker_urls: list[str], **overrides: Any) -> RunningRouter:
        fields: dict[str, Any] = {
            "worker_urls": worker_urls,
            "port": 0,
            "prometheus_port": None,
            "policy": "round_robin",
            "health_check_interval_secs": 3600.0,
        }
        fields.update(overrides)
        router = await start_router(RouterConfig(**fields))
        started.append(router)
        return router

    yield make
    for r in started:
        await r.stop()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
