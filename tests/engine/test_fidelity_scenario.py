"""The prefix-cache fidelity scenario (kept as data for the real-vLLM tier) passes against the emulator."""

from __future__ import annotations

import aiohttp
import pytest

from progrouter.engine.fidelity import run_fidelity_scenario
from support.factories import EngineFactory
from support.fidelity import emulator_fields, load_scenario

pytestmark = pytest.mark.timeout(60)


async def test_emulator_reports_the_expected_cached_tokens(make_engine: EngineFactory) -> None:
    scenario = load_scenario()
    engine = await make_engine(**emulator_fields(scenario))
    async with aiohttp.ClientSession() as session:
        first = await run_fidelity_scenario(session, engine.url, scenario, model=engine.config.model_name)
        # a second run with a fresh salt must not see the first run's cache
        second = await run_fidelity_scenario(session, engine.url, scenario)
    assert [(r.name, r.cached_tokens) for r in first] == [(r.name, r.expected_cached_tokens) for r in first]
    assert all(r.ok for r in second)
    lengths = [len(item["prompt_token_ids"]) for item in scenario["requests"]]
    assert [r.prompt_tokens for r in first] == lengths
    expected = {r.expected_cached_tokens for r in first}
    assert 0 in expected and len(expected) > 3
