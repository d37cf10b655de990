"""Fake workers for the router tests; `make_router` and `client` come from the root tests/conftest.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from .workers import FakeWorker

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
