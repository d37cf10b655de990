"""The emulator's prefix cache reports what real vLLM reports: the fidelity scenario on both."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from progrouter.engine import EngineConfig
from progrouter.engine.fidelity import run_fidelity_scenario
from progrouter.engine.server import start_engine

from .conftest import MODEL_NAME, VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
SCENARIO = Path(__file__).resolve().parents[1] / "data" / "fidelity_scenario.json"


async def test_same_cached_tokens_on_real_vllm_and_the_emulator(vllm_server: VllmServer) -> None:
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
            emulated = await run_fidelity_scenario(s, engine.url, scenario, model=config.model_name)
    finally:
        await engine.stop()
    expected = [(r.name, r.expected_cached_tokens) for r in emulated]
    assert len(expected) == len(scenario["requests"]) and len({c for _n, c in expected}) > 3
    assert [(r.name, r.cached_tokens) for r in emulated] == expected
    for results in real.values():
        assert [(r.name, r.cached_tokens) for r in results] == expected
        assert [r.prompt_tokens for r in results] == [r.prompt_tokens for r in emulated]
