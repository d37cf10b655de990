"""The Codex CLI (the OpenAI Responses API; the session in ``session-id``, a worker in ``thread-id``)
through the router with enable key ``auto``: see ``harness`` for the scenarios."""

from __future__ import annotations

import aiohttp
import pytest

from support.factories import EngineFactory, RouterFactory

from . import harness

pytestmark = pytest.mark.timeout(90)
API = "responses"


async def test_codex_sessions_become_programs_on_one_rank_with_cache_hits(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    fleet = await harness.start(make_engine, make_router, API)
    await harness.sessions_become_programs_on_one_rank_with_cache_hits(API, fleet, client)


async def test_codex_sessions_wait_in_the_pool_under_pressure(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    await harness.sessions_wait_in_the_pool_under_pressure(API, make_engine, make_router, client)


async def test_codex_answers_match_the_engine(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    await harness.answers_match_the_engine(API, make_engine, make_router, client)
