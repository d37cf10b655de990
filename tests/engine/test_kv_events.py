"""The emulator's KV events (vLLM's ``--kv-events-config``), read by a ZMQ subscriber over loopback.

The subscriber here is written from vLLM's wire format (msgpack ``[ts, events, rank]`` with each event a map
tagged by ``type``, frames ``[topic, seq, payload]``, the replay ROUTER's ``[b"", topic, seq, payload]``
answers ending in seq -1), not from the emulator's encoder, so a drift in either direction fails. The
real-vLLM tier (``tests/vllm/test_kv_events.py``) compares the emulator's events with vLLM's own.
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

    def events(self) -> list[dict[str, Any]]:
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


CLEARED = {"type": "AllBlocksCleared"}


def stored(event: dict[str, Any]) -> bool:
    return bool(event["type"] == "BlockStored")


def removed(event: dict[str, Any]) -> bool:
    return bool(event["type"] == "BlockRemoved")


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
    await subs[1].until(lambda r: sum(len(e["block_hashes"]) for _, b in r for e in b[1] if stored(e)) >= 3)
    seqs = [seq for seq, _ in subs[1].received]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # consecutive, one per step that changed it
    assert all(batch[2] == 1 for _, batch in subs[1].received)  # data_parallel_rank
    assert all(isinstance(batch[0], float) for _, batch in subs[1].received)
    events = [e for e in subs[1].events() if stored(e)]
    assert len(events) == 1  # one prefill step: one chain of three blocks
    event = events[0]
    assert event["token_ids"] == prompt[: 3 * BS]  # the prompt's full blocks, their tokens in order
    hashes = event["block_hashes"]
    assert len(hashes) == len(set(hashes)) == 3 and all(0 <= h < 2**64 for h in hashes)
    assert event["parent_block_hash"] is None  # the chain starts at the root
    assert event["block_size"] == BS and event["lora_id"] is None and event["medium"] == "GPU"
    assert event["extra_keys"] == [None] * 3 and event["group_idx"] == 0
    assert subs[0].received == []  # Rank 0 computed nothing new


async def test_a_shared_prefix_is_not_stored_twice_and_eviction_publishes_removed(
    make_engine: EngineFactory, zctx: zmq.asyncio.Context
) -> None:
    cfg = events_config(replay=False)
    eng = await make_engine(num_blocks=16, max_model_len=128, kv_events_config=cfg)
    sub = Subscriber(zctx, cfg["endpoint"])
    await connected(sub, eng.url, 0)
    await reset(eng.url)  # the warm-up's blocks, some stored before the subscriber joined, are gone
    await sub.until(lambda r: any(e == CLEARED for _, b in r for e in b[1]))
    sub.received.clear()
    await complete(eng.url, prompt_of(2, 4), 0)
    await complete(eng.url, prompt_of(2, 4), 0)  # all cached: no new block is stored
    # Four distinct 4-block prompts need more than the 16 blocks: older cached blocks are evicted.
    for seed in (3, 4, 5, 6):
        await complete(eng.url, prompt_of(seed, 4), 0)

    def stored_hashes(r: list[tuple[int, list[Any]]]) -> list[int]:
        return [h for _, b in r for e in b[1] if stored(e) for h in e["block_hashes"]]

    await sub.until(
        lambda r: len(set(stored_hashes(r))) >= 20 and any(removed(e) for _, b in r for e in b[1])
    )
    hashes = stored_hashes(sub.received)
    assert len(hashes) == len(set(hashes))
    seen: set[int] = set()
    for e in sub.events():
        if stored(e):
            seen.update(e["block_hashes"])
        elif removed(e):
            assert len(e["block_hashes"]) == 1  # vLLM sends one event per evicted block
            assert set(e["block_hashes"]) <= seen  # only blocks that were announced are removed
            assert e["medium"] == "GPU"
            seen -= set(e["block_hashes"])
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
        lambda r: any(stored(e) and e["token_ids"][0] == 1000 + 7 * 97 for _, b in r for e in b[1])
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
    await sub.until(lambda r: any(e == CLEARED for _, b in r for e in b[1]))
    assert eng.server.cores[0].kv.pool.num_cached_blocks == 0


def test_pool_reports_runs_evictions_and_refuses_a_busy_reset() -> None:
    rec = KVEventRecorder(block_size=4)
    pool = BlockPool(4, rec)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(blocks, [11, 12, 13], 0, 2, lambda i: [i] * 4)
    pool.cache_full_blocks(blocks, [11, 12, 13], 2, 3, lambda i: [i] * 4)
    assert [(e["block_hashes"], e["parent_block_hash"], e["token_ids"]) for e in rec.take()] == [
        ([11, 12], None, [0, 0, 0, 0, 1, 1, 1, 1]),
        ([13], 12, [2, 2, 2, 2]),
    ]
    assert not pool.reset_prefix_cache()  # blocks in use: nothing changes, nothing is reported
    assert rec.take() == [] and pool.num_cached_blocks == 3
    pool.free_blocks(reversed(blocks))
    pool.get_new_blocks(3)  # the fresh block, then 13 and 12 (the tail, freed first) are evicted
    assert rec.take() == [
        {"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": 0} for h in (13, 12)
    ]


def test_a_recomputed_block_is_a_second_copy_stored_and_removed_on_its_own() -> None:
    """As in vLLM: a fully cached prompt recomputes its last block into a new block under the same hash."""
    rec = KVEventRecorder(block_size=4)
    pool = BlockPool(4, rec)
    first = pool.get_new_blocks(2)
    pool.cache_full_blocks(first, [11, 12], 0, 2, lambda i: [i] * 4)
    pool.touch(first[:1])
    copy = pool.get_new_blocks(1)  # the repeat: block 11 is a hit, 12 is recomputed
    pool.cache_full_blocks([*first[:1], *copy], [11, 12], 1, 2, lambda i: [i] * 4)
    events = rec.take()
    assert [(e["block_hashes"], e["parent_block_hash"]) for e in events] == [([11, 12], None), ([12], 11)]
    assert pool.get_cached_block(12) is first[1] and pool.num_cached_blocks == 2
    pool.free_blocks(reversed(first))  # eviction order: 12 (first copy), 11, then the copy
    pool.free_blocks([first[0], *copy])
    pool.get_new_blocks(2)  # the fresh block and the first copy of 12: the second copy is now found
    assert [e["block_hashes"] for e in rec.take()] == [[12]]
    assert pool.get_cached_block(12) is copy[0]
    pool.get_new_blocks(2)
    assert [e["block_hashes"] for e in rec.take()] == [[11], [12]]
    assert pool.num_cached_blocks == 0


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
