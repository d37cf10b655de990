"""Fault-suite fixtures: a rig factory that always reaps its engine subprocesses, and the scenario table.

Every scenario reports its row (requests, completed, clean errors, client aborts, lost) with ``report``;
the table is printed at the end of the run.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from progrouter.server.runner import RunningRouter
from support.agents import Tally
from support.factories import RouterFactory

from .harness import Rig, start_rig

ROWS: list[str] = []
# Every Program id and prompt the agents send starts with the agent's name (support.agents.body_for).
RAW_IDS = re.compile(r"\b[a-z]\d+-(?:agent|native|streaming|pooled|between_turns|drain)\b")
RigFactory = Callable[..., Awaitable[tuple[Rig, RunningRouter]]]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def make_rig(
    tmp_path: Path, make_router: RouterFactory, session: aiohttp.ClientSession
) -> AsyncIterator[RigFactory]:
    rigs: list[Rig] = []

    async def make(**options: Any) -> tuple[Rig, RunningRouter]:
        rig, router = await start_rig(tmp_path, make_router, session, **options)
        rigs.append(rig)
        return rig, router

    yield make
    for rig in rigs:
        for engine in rig.engines:
            await engine.stop()


@pytest.fixture(autouse=True)
def no_raw_ids_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """The router's log above DEBUG never carries a raw Program id or prompt text, whatever the fault."""
    caplog.set_level(logging.INFO)
    yield
    leaks = [
        f"{r.levelname} {r.name}: {text[:200]}"
        for r in caplog.records
        if r.levelno > logging.DEBUG
        and RAW_IDS.search(text := r.getMessage() + (caplog.handler.format(r) if r.exc_info else ""))
    ]
    assert not leaks, leaks


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Iterator[Callable[[Tally], None]]:
    def add(tally: Tally) -> None:
        ROWS.append(tally.row(request.node.name.removeprefix("test_")))

    yield add


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if ROWS:
        terminalreporter.write_line("")
        terminalreporter.write_line(
            "| scenario | requests | completed | clean errors | client aborts | lost |"
        )
        for row in ROWS:
            terminalreporter.write_line(row)
