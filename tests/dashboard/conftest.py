"""Emulator defaults matching the router's capacity (the loopback tier's fixture, shared), and one served
Program turn, the setup the logging and tracing tests share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from integration.conftest import engine_defaults
from integration.helpers import CAPACITY, program_body, words
from progrouter.engine.server import RunningEngine
from progrouter.server.runner import RunningRouter
from support.factories import EngineFactory, RouterFactory

__all__ = ["engine_defaults", "program_turn"]

ProgramTurn = Callable[..., Awaitable[tuple[RunningEngine, RunningRouter]]]


@pytest.fixture
def program_turn(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> ProgramTurn:
    """``await program_turn(program_id, request_id, **hints)``: one emulator behind a router, one Program
    chat turn sent with that ``X-Request-Id`` and answered 200; returns the engine and the router."""

    async def run(program_id: str, request_id: str, **hints: Any) -> tuple[RunningEngine, RunningRouter]:
        engine = await make_engine()
        router = await make_router([engine.url], {"token_capacity_per_dp_rank": CAPACITY})
        body = program_body(program_id, words("a", 100), **hints)
        async with client.post(
            router.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": request_id}
        ) as response:
            assert response.status == 200
        return engine, router

    return run
