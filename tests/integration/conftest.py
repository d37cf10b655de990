"""Loopback fixtures: emulator engines, a metrics-faulting proxy, routers with Program scheduling."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from progrouter.config import ProgramSchedulingConfig, RouterConfig
from progrouter.engine.config import EngineConfig
from progrouter.engine.server import RunningEngine, start_engine
from progrouter.server.runner import RunningRouter, start_router

from .helpers import BLOCK, CAPACITY, ENGINE_BLOCKS, MODEL, MetricsProxy

EngineFactory = Callable[..., Awaitable[RunningEngine]]
RouterFactory = Callable[..., Awaitable[RunningRouter]]


@pytest.fixture
async def make_engine() -> AsyncIterator[EngineFactory]:
    started: list[RunningEngine] = []

    async def make(**overrides: Any) -> RunningEngine:
        fields: dict[str, Any] = {
            "port": 0,
            "model_name": MODEL,
            "num_blocks": ENGINE_BLOCKS,
            "block_size": BLOCK,
            "max_model_len": CAPACITY,
            "time_scale": 20.0,
        }
        fields.update(overrides)
        engine = await start_engine(EngineConfig(**fields))
        started.append(engine)
        return engine

    yield make
    for engine in started:
        await engine.stop()


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


@pytest.fixture
async def make_router() -> AsyncIterator[RouterFactory]:
    started: list[RunningRouter] = []

    async def make(worker_urls: list[str], program: dict[str, Any] | None, **overrides: Any) -> RunningRouter:
        fields: dict[str, Any] = {
            "worker_urls": worker_urls,
            "port": 0,
            "prometheus_port": None,
            "policy": "round_robin",
            "health_check_interval_secs": 3600.0,
            "program_scheduling": None if program is None else ProgramSchedulingConfig(**program),
        }
        fields.update(overrides)
        router = await start_router(RouterConfig(**fields))
        started.append(router)
        return router

    yield make
    for router in started:
        await router.stop()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
