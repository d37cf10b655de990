"""Differential fixtures: scripted workers, and progrouter or the upstream wheel started with the same flags.

Every scenario test takes ``kind`` ("upstream", "progrouter") and asserts one expected outcome for both, so
the report says per router what holds. The wheel lives in ``.venv-upstream`` (``make upstream``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path

import aiohttp
import pytest

from support.scripted_worker import Script, ScriptedWorker, start_scripted_worker
from support.stopping import stopping

from .routers import ROUTERS, RouterProcess, start_router

# Startup checks every second instead of 30 (ours accepts the flag for the same meaning); backoff kept tiny
# so retries do not slow the tier.
FAST = [
    *("--worker-startup-check-interval", "1"),
    *("--retry-initial-backoff-ms", "1", "--retry-max-backoff-ms", "5"),
]


def flags(urls: Iterable[str], *extra: str, policy: str = "round_robin") -> list[str]:
    """The command line both routers get: these workers (none: no ``--worker-urls``), a policy, FAST."""
    workers = list(urls)
    return [*(["--worker-urls", *workers] if workers else []), "--policy", policy, *FAST, *extra]


WorkerFactory = Callable[..., Awaitable[list[ScriptedWorker]]]
Launcher = Callable[..., Awaitable[RouterProcess]]


@pytest.fixture(params=ROUTERS)
def kind(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
async def workers() -> AsyncIterator[WorkerFactory]:
    """``await workers(n)``: n scripted workers serving from the test's event loop, stopped after."""
    async with stopping(start_scripted_worker) as start:

        async def make(n: int, script: Script | None = None) -> list[ScriptedWorker]:
            return [await start(script) for _ in range(n)]

        yield make


@pytest.fixture
async def launch(tmp_path: Path) -> AsyncIterator[Launcher]:
    """``await launch(kind, flags, ready_path="/readiness")``: a router subprocess, stopped after."""
    async with stopping(start_router) as start:

        async def make(kind: str, flags: list[str], ready_path: str = "/readiness") -> RouterProcess:
            return await start(kind, flags, tmp_path, ready_path)

        yield make


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session
