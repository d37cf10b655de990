"""The router's KV event subscriber against the engine emulator's real ZMQ sockets over loopback."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import msgpack
import pytest
import zmq.asyncio
from prometheus_client import CollectorRegistry

from progrouter.observe.kv_events import KVEventMetrics, KVEventSubscriber, decode_batch
from progrouter.routing.kv_residency import ResidencyIndex, chain_keys
from support.factories import EngineFactory
from support.kv_events import events_config

pytestmark = pytest.mark.timeout(60)
BS = 16


@pytest.fixture
def engine_defaults() -> dict[str, Any]:
    return {"time_scale": 1000.0, "num_blocks": 64, "block_size": BS, "max_model_len": 512}


@pytest.fixture
async def zctx() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.destroy(linger=0)


async def complete(url: str, prompt: list[int]) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}) as resp,
    ):
        assert resp.status == 200, await resp.text()


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def prompt_of(seed: int, n_blocks: int) -> list[int]:
    return [1000 + seed * 97 + i for i in range(n_blocks * BS + 1)]


class Running:
    def __init__(self, sub: KVEventSubscriber) -> None:
        self.sub = sub
        self.task = asyncio.get_running_loop().create_task(sub.run())

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def subscribe(
    index: ResidencyIndex, cfg: dict[str, Any], metrics: KVEventMetrics, ctx: zmq.asyncio.Context, url: str
) -> Running:
    """A running subscriber that has applied a batch (warm-up requests cover ZMQ's slow join)."""
    before = index.rank("e#0").next_seq
    run = Running(KVEventSubscriber(index, "e#0", cfg["endpoint"], cfg.get("replay_endpoint"), metrics, ctx))
    for i in range(200):
        if index.rank("e#0").next_seq != before:
            return run
        await complete(url, [300 + i] * (BS + 1))
        await asyncio.sleep(0.02)
    raise AssertionError("subscriber never received a batch")


def registry_value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_the_index_knows_what_the_engine_holds_and_repairs_a_gap_by_replay(
    make_engine: EngineFactory, zctx: zmq.asyncio.Context
) -> None:
    cfg = events_config()
    eng = await make_engine(kv_events_config=cfg)
    index, registry = ResidencyIndex(), CollectorRegistry()
    metrics = KVEventMetrics(registry)
    run = await subscribe(index, cfg, metrics, zctx, eng.url)
    prompt = prompt_of(1, 3)
    keys = chain_keys(prompt, BS)
    await complete(eng.url, prompt)
    await until(lambda: index.match("e#0", keys) == 3)
    assert registry_value(registry, "progrouter_kv_index_blocks") == index.size() > 0
    assert registry_value(registry, "progrouter_kv_events_lag_seconds", source="e#0") >= 0.0
    # every applied batch is one observation of the lag histogram, each in a bucket no later than +Inf
    batches = registry_value(registry, "progrouter_kv_events_batch_lag_seconds_count", source="e#0")
    assert batches >= 2  # the warm-up's batch and the prompt's
    inf = registry_value(registry, "progrouter_kv_events_batch_lag_seconds_bucket", source="e#0", le="+Inf")
    assert inf == batches
    await run.stop()  # batches published now are missed ...
    missed = prompt_of(2, 2)
    await complete(eng.url, missed)
    run = await subscribe(index, cfg, metrics, zctx, eng.url)  # ... and the next one shows the gap
    await until(lambda: index.match("e#0", chain_keys(missed, BS)) == 2)
    assert index.rank("e#0").gaps >= 1 and index.rank("e#0").lost == 0
    assert registry_value(registry, "progrouter_kv_events_gaps_total", source="e#0", outcome="repaired") >= 1
    await run.stop()


async def test_a_gap_replay_cannot_fill_forgets_the_rank(
    make_engine: EngineFactory, zctx: zmq.asyncio.Context
) -> None:
    cfg = {**events_config(), "buffer_steps": 1}
    eng = await make_engine(kv_events_config=cfg)
    index, registry = ResidencyIndex(), CollectorRegistry()
    metrics = KVEventMetrics(registry)
    run = await subscribe(index, cfg, metrics, zctx, eng.url)
    prompt = prompt_of(3, 3)
    await complete(eng.url, prompt)
    await until(lambda: index.match("e#0", chain_keys(prompt, BS)) == 3)
    await run.stop()
    for seed in (4, 5, 6):
        await complete(eng.url, prompt_of(seed, 1))  # three steps: the buffer keeps only the last
    run = await subscribe(index, cfg, metrics, zctx, eng.url)
    await until(lambda: index.rank("e#0").lost >= 1)
    assert index.match("e#0", chain_keys(prompt, BS)) == 0  # what happened meanwhile is unknown: forgotten
    assert registry_value(registry, "progrouter_kv_events_gaps_total", source="e#0", outcome="lost") >= 1
    await run.stop()


def test_decode_reads_vllms_tagged_maps_and_the_older_tagged_arrays() -> None:
    stored = {
        "type": "BlockStored",
        "block_hashes": [2**63 + 5],
        "parent_block_hash": None,
        "token_ids": [1, 2],
        "block_size": 2,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [["salt"]],
        "group_idx": 0,
    }
    removed = {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU", "group_idx": 0}
    older = ["BlockRemoved", [8], "GPU"]
    payload = msgpack.packb([1.5, [stored, removed, {"type": "AllBlocksCleared"}, older], 0])
    assert decode_batch(payload) == (
        1.5,
        [
            ["BlockStored", [2**63 + 5], None, [1, 2], 2, None, "GPU"],
            ["BlockRemoved", [7]],  # device tier only, so the medium is dropped
            ["AllBlocksCleared"],
            ["BlockRemoved", [8]],
        ],
    )
    # An event type a newer vLLM may add passes through as its tag alone (the index ignores it); an event
    # without a tag, or a batch of the wrong shape, is refused.
    assert decode_batch(msgpack.packb([1.0, [{"type": "Bogus", "x": 1}]])) == (1.0, [["Bogus"]])
    for bad in ([1.0, [{"block_hashes": [1]}]], [1.0, [[]]], {"ts": 1}):
        with pytest.raises(ValueError):
            decode_batch(msgpack.packb(bad))
