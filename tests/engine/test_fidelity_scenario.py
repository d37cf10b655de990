"""The prefix-cache fidelity scenario (kept as data for the real-vLLM tier) passes against the emulator."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from progrouter.engine import EngineConfig
from progrouter.engine.fidelity import run_fidelity_scenario
from progrouter.engine.server import start_engine

SCENARIO = Path(__file__).parent.parent / "data" / "fidelity_scenario.json"

pytestmark = pytest.mark.timeout(60)


async def test_emulator_reports_the_expected_cached_tokens() -> None:
    scenario = json.loads(SCENARIO.read_text())
    req = scenario["requires"]
    config = EngineConfig(
        port=0,
        time_scale=1000.0,
        block_size=scenario["block_size"],
        num_blocks=req["min_num_gpu_blocks"],
        max_model_len=req["min_max_model_len"],
        vocab_size=req["min_vocab_size"],
    )
    engine = await start_engine(config)
    try:
        async with aiohttp.ClientSession() as session:
            first = await run_fidelity_scenario(session, engine.url, scenario, model=config.model_name)
            # a second run with a fresh salt must not see the first run's cache
            second = await run_fidelity_scenario(session, engine.url, scenario)
    finally:
        await engine.stop()
    assert [(r.name, r.cached_tokens) for r in first] == [(r.name, r.expected_cached_tokens) for r in first]
    assert all(r.ok for r in second)
    lengths = [len(item["prompt_token_ids"]) for item in scenario["requests"]]
    assert [r.prompt_tokens for r in first] == lengths
    expected = {r.expected_cached_tokens for r in first}
    assert 0 in expected and len(expected) > 3
