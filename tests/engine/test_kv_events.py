"""The emulator's KV events (vLLM's ``--kv-events-config``), read by a ZMQ subscriber over loopback.

The subscriber here is written from vLLM's wire format (msgpack ``[ts, events, rank]``, frames ``[topic,
seq, payload]``, the replay ROUTER's ``[b"", topic, seq, payload]`` answers ending in seq -1), not from the
emulator's encoder, so a drift in either direction fails.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio

from progrouter.engine.block_pool import BlockPool
from progrouter.engine.cli import add_arguments, config_from_namespace
from progrouter.engine.kv_events import KVEventRecorder, KVEventsConfig, rank_endpoint
from support.factories import EngineFactory
from support.kv_events import events_config

pytestmark = pytest.mark.timeout(60)
BS = 16


@pytest.fixture
def engine_defaults() -> dict[str, Any]:
    return {"time_scale": 1000.0, "num_blocks": 64, "block_size": BS, "max_model_len": 512}


class Subscriber:
    """A SUB socket on one Rank's endpoint that collects ``(seq, batch)`` in arrival order."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str) -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)
        self.received: list[tuple[int, list[Any]]] = []

    async def until(self, pred: Any, timeout: float = 10.0) -> None:
        """Receive until ``pred(self.received)`` holds; fails after ``timeout`` seconds."""

        async def loop() -> None:
            while not pred(self.received):
                topic, seq, payload = await self.sock.recv_multipart()
                assert topic == b""
                self.received.append((int.from_bytes(seq, "big", signed=True), msgpack.unpackb(payload)))

        await asyncio.wait_for(loop(), timeout)

    def events(self) -> list[list[Any]]:
        return [e for _, batch in self.received for e in batch[1]]


@pytest.fixture
async def zctx() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.destroy(linger=0)


async def complete(url: str, prompt: list[int], rank: int, max_tokens: int = 1) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            url + "/v1/completions",
            json={"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True},
            headers={"X-data-parallel-rank": str(rank)},
        ) as resp,
    ):
        assert resp.status == 200, await resp.text()


async def reset(url: str) -> None:
    async with aiohttp.ClientSession() as http, http.post(url + "/reset_prefix_cache") as resp:
        assert resp.status == 200, await resp.text()


async def connected(sub: Subscriber, url: str, rank: int) -> None:
    """ZMQ's slow joiner: send warm-up requests until the subscriber sees a batch, then forget them."""
    for i in range(100):
        await complete(url, [100 + i] * (BS + 1), rank)
        try:
            await sub.until(lambda r: bool(r), timeout=0.1)
            break
        except TimeoutError:
            continue
    else:
        raise AssertionError("subscriber never received a batch")


def prompt_of(seed: int, n_blocks: int) -> list[int]:
    return [1000 + seed * 97 + i for i in range(n_blocks * BS + 1)]


async def test_each_rank_publishes_stored_blocks_with_tokens_parents_and_sequence(
    make_engine: EngineFactory, zctx: zmq.asyncio.Context
) -> None:
    cfg = events_config()
    eng = await make_engine(data_parallel_size=2, kv_events_config=cfg)
    subs = [Subscriber(zctx, rank_endpoint(cfg["endpoint"], r)) for r in (0, 1)]
    for rank, sub in enumerate(subs):
        await connected(sub, eng.url, rank)
        sub.received.clear()
    prompt = prompt_of(1, 3)
    await complete(eng.url, prompt, rank=1)
    await subs[1].until(lambda r: sum(len(e[1]) for _, b in r for e in b[1] if e[0] == "BlockStored") >= 3)
    seqs = [seq for seq, _ in subs[1].received]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # consecutive, one per step that changed it
    assert all(batch[2] == 1 for _, batch in subs[1].received)  # data_parallel_rank
    assert all(isinstance(batch[0], float) for _, batch in subs[1].received)
    stored = [e for e in subs[1].events() if e[0] == "BlockStored"]
    assert len(stored) == 1  # one prefill step: one chain of three blocks
    hashes, parent, tokens = stored[0][1], stored[0][2], stored[0][3]
    assert tokens == prompt[: 3 * BS]  # the prompt's full blocks, their tokens in order
    assert len(hashes) == len(set(hashes)) == 3
    assert parent is None  # the chain starts at the root
    assert all(e[4] == BS and e[5] is None and e[6] == "GPU" for e in stored)
    assert subs[0].received == []  # Rank 0 computed nothing new


async def test_a_shared_prefix_is_not_stored_twice_and_eviction_publishes_removed(
    make_engine: EngineFactory, zctx: zmq.asyncio.Context
) -> None:
    cfg = events_config(replay=False)
    eng = await make_engine(num_blocks=16, max_model_len=128, kv_events_config=cfg)
    sub = Subscriber(zctx, cfg["endpoint"])
    await connected(sub, eng.url, 0)
    await reset(eng.url)  # the warm-up's blocks, some stored before the subscriber joined, are gone
    await sub.until(lambda r: any(e == ["AllBlocksCleared"] for _, b in r for e in b[1]))
    sub.received.clear()
    await complete(eng.url, prompt_of(2, 4), 0)
    await complete(eng.url, prompt_of(2, 4), 0)  # all cached: no new block is stored
    # Four distinct 4-block prompts need more than the 16 blocks: older cached blocks are evicted.
    for seed in (3, 4, 5, 6):
        await complete(eng.url, prompt_of(seed, 4), 0)

    def stored_hashes(r: list[tuple[int, list[Any]]]) -> list[int]:
        return [h for _, b in r for e in b[1] if e[0] == "BlockStored" for h in e[1]]

    await sub.until(
        lambda r: len(set(stored_hashes(r))) >= 20 and any(e[0] == "BlockRemoved" for _, b in r for e in b[1])
    )
    stored = stored_hashes(sub.received)
    assert len(stored) == len(set(stored))
    seen: set[int] = set()
    for e in sub.events():
        if e[0] == "BlockStored":
            seen.update(e[1])
        elif e[0] == "BlockRemoved":
            assert set(e[1]) <= seen  # only blocks that were announced are removed
            assert e[2] == "GPU"
            seen -= set(e[1])
    assert len(seen) <= 16  # what the subscriber thinks is resident fits in the pool


async def test_replay_returns_missed_batches_and_the_end_marker(
    make_engine: EngineFactory, zctx: zmq.asyncio.Context
) -> None:
    cfg = events_config()
    eng = await make_engine(kv_events_config=cfg)
    sub = Subscriber(zctx, cfg["endpoint"])
    await connected(sub, eng.url, 0)
    await complete(eng.url, prompt_of(7, 2), 0)
    await sub.until(
        lambda r: any(e[0] == "BlockStored" and e[3][0] == 1000 + 7 * 97 for _, b in r for e in b[1])
    )
    live = {seq: batch for seq, batch in sub.received}
    dealer = zctx.socket(zmq.DEALER)
    dealer.connect(cfg["replay_endpoint"])
    start = min(live)
    await dealer.send_multipart([b"", start.to_bytes(8, "big")])
    replayed: dict[int, list[Any]] = {}
    while True:
        empty, topic, seq_b, payload = await asyncio.wait_for(dealer.recv_multipart(), 10)
        assert empty == b"" and topic == b""
        seq = int.from_bytes(seq_b, "big", signed=True)
        if seq == -1:
            assert payload == b""
            break
        replayed[seq] = msgpack.unpackb(payload)
    assert min(replayed) == start
    for seq, batch in live.items():
        assert replayed[seq] == batch  # the same bytes' content, same numbering
    dealer.close(linger=0)


async def test_reset_prefix_cache_publishes_all_blocks_cleared(
    make_engine: EngineFactory, zctx: zmq.asyncio.Context
) -> None:
    cfg = events_config(replay=False)
    eng = await make_engine(kv_events_config=cfg)
    sub = Subscriber(zctx, cfg["endpoint"])
    await connected(sub, eng.url, 0)
    await reset(eng.url)
    await sub.until(lambda r: any(e == ["AllBlocksCleared"] for _, b in r for e in b[1]))
    assert eng.server.cores[0].kv.pool.num_cached_blocks == 0


def test_pool_reports_runs_evictions_and_refuses_a_busy_reset() -> None:
    rec = KVEventRecorder(block_size=4)
    pool = BlockPool(4, rec)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(blocks, [11, 12, 13], 0, 2, lambda i: [i] * 4)
    pool.cache_full_blocks(blocks, [11, 12, 13], 2, 3, lambda i: [i] * 4)
    assert rec.take() == [
        ["BlockStored", [11, 12], None, [0, 0, 0, 0, 1, 1, 1, 1], 4, None, "GPU"],
        ["BlockStored", [13], 12, [2, 2, 2, 2], 4, None, "GPU"],
    ]
    assert not pool.reset_prefix_cache()  # blocks in use: nothing changes, nothing is reported
    assert rec.take() == [] and pool.num_cached_blocks == 3
    pool.free_blocks(reversed(blocks))
    pool.get_new_blocks(3)  # the fresh block, then 13 and 12 (the tail, freed first) are evicted
    assert rec.take() == [["BlockRemoved", [13, 12], "GPU"]]


def test_the_flag_takes_vllms_json_and_refuses_bad_input() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--kv-events-config", '{"enable_kv_cache_events": true, "publisher": "zmq"}'])
    cfg = config_from_namespace(args).kv_events_config
    assert cfg == KVEventsConfig(enable_kv_cache_events=True, publisher="zmq")
    assert cfg.endpoint == "tcp://*:5557" and cfg.buffer_steps == 10_000
    for bad in ("{not json", '{"enable_kv_cache_events": true, "bogus": 1}', '{"publisher": "kafka"}'):
        with pytest.raises(SystemExit):
            parser.parse_args(["--kv-events-config", bad])


def test_rank_endpoints_follow_vllms_convention() -> None:
    assert rank_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert rank_endpoint("tcp://*:5557", 3) == "tcp://*:5560"
    assert rank_endpoint("ipc:///tmp/kv", 2) == "ipc:///tmp/kv_dp2"
    for bad in ("tcp://host", "udp://x:1", "tcp://*:65535"):
        with pytest.raises(ValueError):
            rank_endpoint(bad, 1)
