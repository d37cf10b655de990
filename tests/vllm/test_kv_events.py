"""The emulator publishes the KV events real vLLM publishes: the fidelity scenario, an eviction, a reset.

One vLLM CPU server of its own (one Rank, 64 KV blocks so the run evicts, KV events on, its
``/reset_prefix_cache`` via ``VLLM_SERVER_DEV_MODE``) and one emulator with the same block size and usable
KV (vLLM keeps one block as its null block, so the emulator gets 63) run the same requests one at a time;
a subscriber written from vLLM's wire format reads both. Compared per block, in order: stored or removed,
its token ids and its parent's token ids (engine hashes differ: vLLM's are seeded, the emulator's are its
own). Also compared: consecutive sequence numbers, the Rank in every batch, the replay socket's answer,
and each event's fields apart from the hash values.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio

from progrouter.engine.fidelity import run_fidelity_scenario
from support.factories import EngineFactory
from support.fidelity import emulator_fields, load_scenario

from .conftest import MODEL_NAME, VllmServer, running_vllm, vllm_command

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

NUM_BLOCKS = 64  # vLLM's; its block 0 is the null block, so 63 hold KV
BLOCK_SIZE = 32
TOPIC = "kv"
Batch = tuple[int, list[Any]]  # (seq, [ts, events, rank])


def block(k: int) -> list[int]:
    """The scenario's block Bk (its description gives the rule); k >= 20 never occurs in the scenario."""
    return [100 + (k * 131 + i * 17) % 900 for i in range(BLOCK_SIZE)]


def events_config(directory: Path) -> dict[str, Any]:
    """IPC endpoints: vLLM and the emulator both bind them (vLLM connects, not binds, a ``tcp://host:port``
    PUB endpoint without a wildcard), and no TCP port is opened."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"ipc://{directory}/pub",
        "replay_endpoint": f"ipc://{directory}/replay",
        "topic": TOPIC,
    }


@pytest.fixture(scope="module")
def vllm_with_events(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VllmServer, dict[str, Any]]]:
    cfg = events_config(tmp_path_factory.mktemp("vllm-kv"))
    extra = ("--kv-events-config", json.dumps(cfg))

    def command(python: str, model: str, port: int) -> list[str]:
        return vllm_command(
            python, model, port, dp_size=1, num_blocks=NUM_BLOCKS, max_model_len=1024, extra=extra
        )

    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"}
    with running_vllm(command, "vLLM with KV events", env) as server:
        yield server, cfg


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    async with http.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        data: dict[str, Any] = await resp.json(content_type=None) or {}
        return data


async def receive_until(sub: zmq.asyncio.Socket, got: list[Batch], done: Any, timeout: float = 60.0) -> None:
    async def loop() -> None:
        while not done(got):
            topic, seq, payload = await sub.recv_multipart()
            assert topic == TOPIC.encode()
            got.append((int.from_bytes(seq, "big", signed=True), msgpack.unpackb(payload)))

    await asyncio.wait_for(loop(), timeout)


async def reset(http: aiohttp.ClientSession, base_url: str, model: str, marker: list[int]) -> None:
    """Empty the prefix cache, then store one ``marker`` block: vLLM publishes a step's events at the end of
    the step, so its ``AllBlocksCleared`` goes out with the next request's batch (the emulator's at once)."""
    await post(http, f"{base_url}/reset_prefix_cache")
    await post(http, f"{base_url}/v1/completions", {"model": model, "prompt": marker, "max_tokens": 1})


def cleared(got: list[Batch]) -> bool:
    return any(e["type"] == "AllBlocksCleared" for _, batch in got for e in batch[1])


async def record_run(base_url: str, model: str, cfg: dict[str, Any]) -> tuple[list[Batch], list[Batch]]:
    """Join, start from an empty prefix cache, run the scenario, evict, reset; the live batches from the
    first reset on and what the replay socket returns for them."""
    scenario = load_scenario()
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(cfg["endpoint"])
    got: list[Batch] = []
    try:
        async with aiohttp.ClientSession() as http:
            complete = f"{base_url}/v1/completions"
            for i in range(100):  # ZMQ's slow joiner: warm up until a batch arrives
                await post(http, complete, {"model": model, "prompt": block(200 + i), "max_tokens": 1})
                try:
                    await receive_until(sub, got, bool, timeout=0.5)
                    break
                except TimeoutError:
                    continue
            await reset(http, base_url, model, marker=block(300))
            await receive_until(sub, got, cleared)
            del got[:-1]  # the reset's batch (its last) starts the comparison
            results = await run_fidelity_scenario(
                http, base_url, scenario, model=model, cache_salt="fidelity"
            )
            assert [r.cached_tokens for r in results] == [r.expected_cached_tokens for r in results]
            for first in (20, 40, 60):  # 60 new blocks into 63: the scenario's blocks are evicted
                prompt = [t for k in range(first, first + 20) for t in block(k)]
                await post(http, complete, {"model": model, "prompt": prompt, "max_tokens": 1})
            await reset(http, base_url, model, marker=block(301))
            await receive_until(sub, got, lambda g: block_sequence(g)[-1] == ("stored", block(301), None))
        replayed = await replay(ctx, cfg["replay_endpoint"], got[0][0])
    finally:
        ctx.destroy(linger=0)
    return got, replayed


async def replay(ctx: zmq.asyncio.Context, endpoint: str, start: int) -> list[Batch]:
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    await dealer.send_multipart([b"", start.to_bytes(8, "big")])
    out: list[Batch] = []
    while True:
        empty, topic, seq_b, payload = await asyncio.wait_for(dealer.recv_multipart(), 30)
        seq = int.from_bytes(seq_b, "big", signed=True)
        if seq == -1:
            assert (empty, topic, payload) == (b"", b"", b"")
            return out
        assert empty == b"" and topic == TOPIC.encode()
        out.append((seq, msgpack.unpackb(payload)))


def block_sequence(batches: list[Batch]) -> list[tuple[str, list[int] | None, list[int] | None]]:
    """Per block, in order: ``("stored" | "removed", its token ids, its parent's token ids)``, and
    ``("cleared", None, None)``; a removed block's tokens are those its hash was last stored with."""
    tokens_of: dict[int, list[int]] = {}
    parent_of: dict[int, int | None] = {}
    out: list[tuple[str, list[int] | None, list[int] | None]] = []
    for _, batch in batches:
        for e in batch[1]:
            if e["type"] == "BlockStored":
                size = e["block_size"]
                parent = e["parent_block_hash"]
                for i, h in enumerate(e["block_hashes"]):
                    tokens_of[h] = e["token_ids"][i * size : (i + 1) * size]
                    parent_of[h] = parent
                    out.append(("stored", tokens_of[h], None if parent is None else tokens_of[parent]))
                    parent = h
            elif e["type"] == "BlockRemoved":
                for h in e["block_hashes"]:
                    p = parent_of[h]
                    out.append(("removed", tokens_of[h], None if p is None else tokens_of[p]))
            else:
                out.append(("cleared", None, None))
    return out


def shapes(batches: list[Batch]) -> set[tuple[str, tuple[str, ...], Any]]:
    """Each event's type, field names and the values that are not hashes or token ids."""
    skip = {"type", "block_hashes", "parent_block_hash", "token_ids", "extra_keys"}
    return {
        (e["type"], tuple(sorted(e)), tuple(sorted((k, v) for k, v in e.items() if k not in skip)))
        for _, batch in batches
        for e in batch[1]
    }


async def test_the_emulator_publishes_the_block_events_real_vllm_publishes(
    vllm_with_events: tuple[VllmServer, dict[str, Any]], make_engine: EngineFactory, tmp_path: Path
) -> None:
    server, vllm_cfg = vllm_with_events
    emu_cfg = events_config(tmp_path)
    fields = emulator_fields(load_scenario()) | {"num_blocks": NUM_BLOCKS - 1, "max_model_len": 1024}
    engine = await make_engine(**fields, model_name=MODEL_NAME, kv_events_config=emu_cfg)
    real, real_replay = await record_run(server.url, MODEL_NAME, vllm_cfg)
    emulated, emulated_replay = await record_run(engine.url, MODEL_NAME, emu_cfg)

    expected = block_sequence(real)
    kinds = [kind for kind, _, _ in expected]
    assert kinds.count("removed") > 10 and kinds.count("cleared") == 2  # the run did evict
    assert block_sequence(emulated) == expected
    for batches, again in ((real, real_replay), (emulated, emulated_replay)):
        seqs = [seq for seq, _ in batches]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # consecutive: nothing lost
        assert all(len(b) == 3 and b[2] == 0 and isinstance(b[0], float) for _, b in batches)
        assert again == batches  # the replay socket returns the same batches, same numbers
    assert shapes(emulated) == shapes(real)
