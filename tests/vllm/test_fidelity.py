"""The emulator's prefix cache reports what real vLLM reports: the fidelity scenario on both."""

from __future__ import annotations

import aiohttp
import pytest

from progrouter.engine.fidelity import run_fidelity_scenario
from support.factories import EngineFactory
from support.fidelity import emulator_fields, load_scenario

from .conftest import MODEL_NAME, VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


async def test_same_cached_tokens_on_real_vllm_and_the_emulator(
    vllm_server: VllmServer, make_engine: EngineFactory
) -> None:
    scenario = load_scenario()
    engine = await make_engine(**emulator_fields(scenario))
    async with aiohttp.ClientSession() as s:
        real = {
            rank: await run_fidelity_scenario(
                s,
                vllm_server.url,
                scenario,
                model=MODEL_NAME,
                headers={"X-data-parallel-rank": str(rank)},
            )
            for rank in range(vllm_server.dp_size)
        }
        emulated = await run_fidelity_scenario(s, engine.url, scenario, model=engine.config.model_name)
    expected = [(r.name, r.expected_cached_tokens) for r in emulated]
    assert len(expected) == len(scenario["requests"]) and len({c for _n, c in expected}) > 3
    assert [(r.name, r.cached_tokens) for r in emulated] == expected
    for results in real.values():
        assert [(r.name, r.cached_tokens) for r in results] == expected
        assert [r.prompt_tokens for r in results] == [r.prompt_tokens for r in emulated]
