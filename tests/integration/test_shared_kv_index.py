"""``--policy kv_aware`` with residency-aware Program scheduling: one set of KV event subscribers (one per
Rank) fills one index, which the policy routes plain requests by and the Program scheduler reads."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from progrouter.routing.kv_aware import KvAwarePolicy
from progrouter.routing.kv_residency import chain_keys
from support.factories import EngineFactory, RouterFactory
from support.kv_events import events_config, until_heard
from support.tiny_tokenizer import write_tiny_tokenizer

from .test_kv_aware import BS, post, served, sources, until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def engine_defaults() -> dict[str, Any]:
    return {"time_scale": 1000.0, "num_blocks": 256, "block_size": BS, "max_model_len": 1024}


def program_body(model: str, program_id: str, prompt: list[int]) -> dict[str, Any]:
    context = {"program_id": program_id, "kv_retention_ttl_seconds": 30}
    return {"model": model, "prompt": prompt, "vllm_xargs": {"agentic_context": json.dumps(context)}}


async def programs(router_url: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(router_url + "/scheduling/diagnostics") as resp:
        assert resp.status == 200
        data: dict[str, Any] = await resp.json()
    return [p for rank in data["ranks"] for p in rank["programs"]]


async def test_programs_bind_by_the_index_kv_aware_fills(
    make_engine: EngineFactory, make_router: RouterFactory
) -> None:
    cfg = events_config()
    engine = await make_engine(data_parallel_size=2, kv_events_config=cfg)
    program = {"residency_aware": True, "token_capacity_per_dp_rank": 3000, "metrics_interval_seconds": 0.1}
    router = await make_router([engine.url], program, **sources(engine, cfg))
    policy = router.state.policy
    assert isinstance(policy, KvAwarePolicy)
    kv_tasks = [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("progrouter-kv-events-")]
    assert sorted(kv_tasks) == sorted(  # the policy's subscribers only; the gate runs none of its own
        [
            f"progrouter-kv-events-{engine.url}@0",
            f"progrouter-kv-events-{engine.url}@1",
            "progrouter-kv-events-expire",
        ]
    )
    ranks = [f"{engine.url}@0", f"{engine.url}@1"]
    await until_heard(engine.url, [0, 1], lambda r: policy.index.match(ranks[r], []) is not None, BS)
    holders = {
        f"p{i}": i % 2 for i in range(4)
    }  # alternate: a binding strategy agrees with all by chance 1/16
    prompts = {p: [*range(1000 * (i + 1), 1000 * (i + 1) + 4 * BS), 7] for i, p in enumerate(holders)}
    for p, rank in holders.items():  # each Rank computes its prefixes, sent straight to it: the router
        await post(
            engine.url, {"prompt": prompts[p]}, {"X-data-parallel-rank": str(rank)}
        )  # only hears events
    for p, rank in holders.items():
        keys = chain_keys(prompts[p], BS)
        await until(lambda k=keys, r=rank: policy.index.match(ranks[r], k) == 4)
    before = served(engine)
    for p in holders:
        await post(router.url, program_body(engine.config.model_name, p, prompts[p]))
    assert [a - b for a, b in zip(served(engine), before, strict=True)] == [2, 2]
    placed = await programs(router.url)
    assert len(placed) == 4  # and each is on the Rank that holds its prompt (read from the shared index):
    assert [p["resident_tokens"] for p in placed] == [4 * BS] * 4  # on the other Rank it would be 0
    # kv_aware still routes plain requests by the same index: a prefix Rank 1 holds goes there.
    before = served(engine)
    await post(router.url, {"prompt": [*prompts["p1"], 9]})
    assert [a - b for a, b in zip(served(engine), before, strict=True)] == [0, 1]


async def test_a_chat_program_is_matched_through_the_policys_tokenizer(
    make_engine: EngineFactory, make_router: RouterFactory, tmp_path: Path
) -> None:
    """The emulator has its own word tokenizer, so each Rank is given the ids the tiny model's template gives
    (as test_kv_aware does); a chat Program arriving through the router is keyed by the same ids (the
    policy's tokenizer) and binds to the Rank holding them."""
    cfg = events_config()
    engine = await make_engine(data_parallel_size=2, kv_events_config=cfg)
    folder = write_tiny_tokenizer(tmp_path / "model")
    program = {"residency_aware": True, "token_capacity_per_dp_rank": 3000, "metrics_interval_seconds": 0.1}
    router = await make_router([engine.url], program, tokenizer=str(folder), **sources(engine, cfg))
    policy = router.state.policy
    assert isinstance(policy, KvAwarePolicy) and policy.tokenizer is not None
    holders = {"c0": 0, "c1": 1, "c2": 0, "c3": 1}
    chats = {
        p: [{"role": "user", "content": " ".join(f"w{i * 97 + k}" for k in range(80))}]
        for i, p in enumerate(holders)
    }
    ranks = [f"{engine.url}@0", f"{engine.url}@1"]
    await until_heard(engine.url, [0, 1], lambda r: policy.index.match(ranks[r], []) is not None, BS)
    for p, rank in holders.items():
        ids = policy.tokenizer.encode_chat(chats[p])
        await post(engine.url, {"prompt": ids}, {"X-data-parallel-rank": str(rank)})
        await until(lambda i=ids, r=rank: policy.index.match(ranks[r], chain_keys(i, BS)) == len(i) // BS)
    before = served(engine)
    for p in holders:
        context = {"program_id": p, "kv_retention_ttl_seconds": 30}
        body = {
            "model": engine.config.model_name,
            "max_tokens": 1,
            "messages": chats[p],
            "vllm_xargs": {"agentic_context": json.dumps(context)},
        }
        async with (
            aiohttp.ClientSession() as http,
            http.post(router.url + "/v1/chat/completions", json=body) as resp,
        ):
            assert resp.status == 200, await resp.text()
    assert [a - b for a, b in zip(served(engine), before, strict=True)] == [2, 2]
    placed = await programs(router.url)
    assert len(placed) == 4 and all(p["resident_tokens"] > 0 for p in placed)  # each on its holder
