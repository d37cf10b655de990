"""Residency-aware Program scheduling live: router + emulator publishing KV events over loopback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from progrouter.server.runner import RunningRouter
from support.factories import EngineFactory, RouterFactory
from support.kv_events import until_heard

from .helpers import BLOCK, CAPACITY, MODEL, wait_until

pytestmark = pytest.mark.timeout(60)


def token_prompt(seed: int, blocks: int) -> list[int]:
    return [1000 + seed * 131 + i for i in range(blocks * BLOCK + 1)]


def body(program_id: str, prompt: list[int], **context: Any) -> dict[str, Any]:
    agentic = {"program_id": program_id, **context}
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 1,
        "vllm_xargs": {"agentic_context": json.dumps(agentic)},
    }


async def programs(client: aiohttp.ClientSession, router: RunningRouter) -> list[dict[str, Any]]:
    async with client.get(router.url + "/scheduling/diagnostics") as response:
        assert response.status == 200
        data: dict[str, Any] = await response.json()
    return [p for rank in data["ranks"] for p in rank["programs"]]


async def test_diagnostics_show_what_the_rank_holds_and_an_evicted_program_stops_holding(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"ipc://{tmp_path}/kv"}
    engine = await make_engine(kv_events_config=events)
    router = await make_router(
        [engine.url],
        {
            "token_capacity_per_dp_rank": CAPACITY,
            "metrics_interval_seconds": 0.1,
            "residency_aware": True,
            "kv_event_sources": {engine.url: events["endpoint"]},
            "kv_event_block_size": BLOCK,
        },
    )
    lag = "progrouter_kv_events_lag_seconds"
    await until_heard(
        engine.url,
        [0],
        lambda _: router.registry.get_sample_value(lag, {"source": engine.url}) is not None,
        BLOCK,
    )
    prompt = token_prompt(1, 40)  # 640 tokens in 40 full blocks
    async with client.post(
        router.url + "/v1/completions", json=body("a", prompt, kv_retention_ttl_seconds=60)
    ) as resp:
        assert resp.status == 200, await resp.text()
    [a] = await wait_until(
        lambda: programs(client, router), lambda ps: len(ps) == 1 and ps[0]["resident_tokens"] == 40 * BLOCK
    )
    assert a["estimated_context_tokens"] >= len(prompt)  # the ledger's estimate (from bytes), next to it
    assert a["state"] == "active"  # its 60 s TTL holds the placement
    # Other traffic (no Program) evicts a's blocks: KV is 188 blocks, and these are 180 new ones.
    for seed in (2, 3, 4, 5):
        async with client.post(
            router.url + "/v1/completions",
            json={"model": MODEL, "prompt": token_prompt(seed, 45), "max_tokens": 1},
        ) as resp:
            assert resp.status == 200, await resp.text()
    [a] = await wait_until(lambda: programs(client, router), lambda ps: ps[0]["state"] == "paused")
    assert a["resident_tokens"] < 40 * BLOCK and a["pause_reason"] == "ttl_expired"
