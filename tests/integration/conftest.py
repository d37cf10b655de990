"""Loopback fixtures: emulator defaults that match the router's capacity, and a metrics-faulting proxy.

``make_engine``, ``make_router`` and ``client`` come from the root tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from .helpers import ENGINE_DEFAULTS, MetricsProxy


@pytest.fixture
def engine_defaults() -> dict[str, Any]:
    return dict(ENGINE_DEFAULTS)


@pytest.fixture
async def make_proxy() -> AsyncIterator[Callable[[str], Awaitable[MetricsProxy]]]:
    started: list[MetricsProxy] = []

    async def make(upstream: str) -> MetricsProxy:
        proxy = await MetricsProxy(upstream).start()
        started.append(proxy)
        return proxy

    yield make
    for proxy in started:
        await proxy.stop()
