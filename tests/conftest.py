"""Fixtures shared by every test directory: emulator engines, routers and an HTTP client, all stopped after.

A directory (or module) changes the emulator's defaults by overriding the ``engine_defaults`` fixture.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from progrouter import compiled
from progrouter.engine import EngineConfig
from progrouter.engine.server import RunningEngine, start_engine
from progrouter.server.runner import RunningRouter, start_router
from support.factories import EngineFactory, RouterFactory, router_config
from support.stopping import stopping


def pytest_sessionstart(session: pytest.Session) -> None:
    """A compiled module shadows its source: tests of an edited source would run the old build."""
    changed = compiled.stale()
    if changed:
        pytest.exit(
            f"sources changed since the build: {', '.join(changed)}; run `make compile`", returncode=2
        )


@pytest.fixture
def engine_defaults() -> dict[str, Any]:
    """EngineConfig fields every ``make_engine`` call starts from (besides ``port=0``)."""
    return {}


@pytest.fixture
async def make_engine(engine_defaults: dict[str, Any]) -> AsyncIterator[EngineFactory]:
    """``await make_engine(**fields)``: an emulator on a free loopback port, stopped after the test."""

    async def start(**overrides: Any) -> RunningEngine:
        return await start_engine(EngineConfig.model_validate({"port": 0, **engine_defaults, **overrides}))

    async with stopping(start) as make:
        yield make


@pytest.fixture
async def make_router() -> AsyncIterator[RouterFactory]:
    """``await make_router(worker_urls, program=None, **fields)``: see ``support.factories.router_config``."""

    async def start(
        worker_urls: list[str], program: dict[str, Any] | None = None, **overrides: Any
    ) -> RunningRouter:
        return await start_router(router_config(worker_urls, program, **overrides))

    async with stopping(start) as make:
        yield make


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


if os.environ.get("PROGROUTER_TEST_LOOP") == "uvloop":  # defined only then: the hook may not answer None

    def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Any]:
        """Run the async tests on uvloop, the loop ``progrouter serve`` uses (``make test-uvloop``)."""
        import uvloop

        return {"uvloop": uvloop.new_event_loop}
