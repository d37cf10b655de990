"""kv_aware end to end: the emulator publishes KV events, the router subscribes over ZMQ and sends each
request over HTTP to the Rank that holds its prefix; a silent fleet is routed the old way."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from progrouter.engine.server import RunningEngine
from progrouter.routing.kv_aware import KvAwarePolicy
from progrouter.routing.kv_residency import chain_keys
from support.factories import EngineFactory, RouterFactory
from support.kv_events import events_config, until_heard
from support.tiny_tokenizer import write_tiny_tokenizer

pytestmark = pytest.mark.timeout(60)
BS = 16


@pytest.fixture
def engine_defaults() -> dict[str, Any]:
    return {"time_scale": 1000.0, "num_blocks": 256, "block_size": BS, "max_model_len": 1024}


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def sources(engine: RunningEngine, cfg: dict[str, Any]) -> dict[str, Any]:
    """The router settings that subscribe to ``engine``'s two Ranks (endpoint p, p + 1)."""
    host, _, port = cfg["endpoint"].rpartition(":")
    rhost, _, rport = cfg["replay_endpoint"].rpartition(":")
    return {
        "policy": "kv_aware",
        "intra_node_data_parallel_size": 2,
        "kv_event_block_size": BS,
        "kv_event_model": engine.config.model_name,
        "kv_event_source": [f"{engine.url}={host}:{port},{host}:{int(port) + 1}"],
        "kv_event_replay_source": [f"{engine.url}={rhost}:{rport},{rhost}:{int(rport) + 1}"],
    }


async def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + "/v1/completions", json={"max_tokens": 1, **body}, headers=headers) as resp,
    ):
        assert resp.status == 200, await resp.text()


def served(engine: RunningEngine) -> list[int]:
    return [sum(core.stats.request_success.values()) for core in engine.server.cores]


async def heard_both(engine: RunningEngine, policy: KvAwarePolicy) -> None:
    """Both Ranks' subscribers have heard a batch (a batch published before one joined is never seen)."""
    ranks = [f"{engine.url}@0", f"{engine.url}@1"]
    await until_heard(engine.url, [0, 1], lambda r: policy.index.match(ranks[r], []) is not None, BS)


async def test_a_request_goes_to_the_rank_that_announced_its_prefix(
    make_engine: EngineFactory, make_router: RouterFactory
) -> None:
    cfg = events_config()
    engine = await make_engine(data_parallel_size=2, kv_events_config=cfg)
    router = await make_router([engine.url], **sources(engine, cfg))
    policy = router.state.policy
    assert isinstance(policy, KvAwarePolicy)
    await heard_both(engine, policy)
    prefix = list(range(100, 100 + 4 * BS))
    # Rank 1 computes the prefix (sent straight to it, the router does not know), Rank 0 something else.
    await post(engine.url, {"prompt": prefix}, {"X-data-parallel-rank": "1"})
    await post(engine.url, {"prompt": list(range(900, 900 + 4 * BS))}, {"X-data-parallel-rank": "0"})
    r0, r1 = f"{engine.url}@0", f"{engine.url}@1"
    keys = chain_keys(prefix, BS)
    await until(lambda: policy.index.match(r1, keys) == 4 and policy.index.match(r0, keys) == 0)
    before = served(engine)
    for i in range(3):
        await post(router.url, {"prompt": [*prefix, 7, i]})
    after = served(engine)
    assert [a - b for a, b in zip(after, before, strict=True)] == [0, 3]
    cached = engine.server.cores[1].stats.prompt_tokens_cached
    assert cached >= 3 * 4 * BS  # every routed request found the whole prefix there


async def test_chat_is_matched_by_the_tokenizer_when_the_engine_tokenizes_the_same_way(
    make_engine: EngineFactory, make_router: RouterFactory, tmp_path: Path
) -> None:
    """The emulator has its own word tokenizer, so the router's tokenizer is checked on what it computes:
    a chat routed with --tokenizer is keyed by the ids the tiny model's template gives."""
    cfg = events_config()
    engine = await make_engine(data_parallel_size=2, kv_events_config=cfg)
    folder = write_tiny_tokenizer(tmp_path / "model")
    router = await make_router([engine.url], tokenizer=str(folder), **sources(engine, cfg))
    policy = router.state.policy
    assert isinstance(policy, KvAwarePolicy) and policy.tokenizer is not None
    await heard_both(engine, policy)
    words = " ".join(f"w{i}" for i in range(80))
    ids = policy.tokenizer.encode_chat([{"role": "user", "content": words}])
    await post(engine.url, {"prompt": ids}, {"X-data-parallel-rank": "1"})  # Rank 1 holds those ids
    await until(lambda: policy.index.match(f"{engine.url}@1", chain_keys(ids, BS)) == len(ids) // BS)
    before = served(engine)
    body = {
        "model": engine.config.model_name,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": words}],
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(router.url + "/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status == 200, await resp.text()
    assert [a - b for a, b in zip(served(engine), before, strict=True)] == [0, 1]


async def test_silent_sources_route_the_old_way(
    make_engine: EngineFactory, make_router: RouterFactory
) -> None:
    cfg = events_config()
    engine = await make_engine(data_parallel_size=2)  # publishes nothing: every Rank stays unknown
    router = await make_router([engine.url], **sources(engine, cfg))
    policy = router.state.policy
    assert isinstance(policy, KvAwarePolicy)
    text = " ".join(f"w{i}" for i in range(64))
    for i in range(4):
        await post(router.url, {"prompt": f"{text} x{i}"})
    assert sum(served(engine)) == 4
    assert max(served(engine)) == 4  # cache_aware kept the shared text on one Rank
    assert sum(policy.fallback.index.size(t.id) for t in router.state.candidates) > 0  # cache_aware's tree
