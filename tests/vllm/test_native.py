"""Native (request-level) routing through progrouter in front of real vLLM with two DP Ranks."""

from __future__ import annotations

import aiohttp
import pytest

from support.factories import RouterFactory

from .conftest import MODEL_NAME, VllmServer
from .helpers import engine_counters, read_sse

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


async def test_native_round_robin_reaches_both_ranks(
    make_router: RouterFactory, vllm_server: VllmServer
) -> None:
    router = await make_router(policy="round_robin")
    async with aiohttp.ClientSession() as s:
        before = await engine_counters(s, vllm_server.url)
        for i in range(4):
            body = {"model": MODEL_NAME, "prompt": list(range(200 + i, 264 + i)), "max_tokens": 4}
            async with s.post(router.url + "/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                data = await resp.json()
            assert data["usage"]["prompt_tokens"] == 64
            assert data["usage"]["completion_tokens"] >= 1
        after = await engine_counters(s, vllm_server.url)
    grew = {e: after[e]["vllm:prompt_tokens_total"] - before[e]["vllm:prompt_tokens_total"] for e in after}
    assert grew == {"0": 128.0, "1": 128.0}  # the router's X-data-parallel-rank put two on each Rank


async def test_native_streaming_chat_passes_through(make_router: RouterFactory) -> None:
    router = await make_router(policy="cache_aware")
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "def fibonacci(n):"}],
        "max_tokens": 12,
        "min_tokens": 12,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession() as s, s.post(router.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events, done = await read_sse(resp)
    assert done
    deltas = [e["choices"][0]["delta"].get("content") for e in events if e.get("choices")]
    assert sum(1 for d in deltas if d) >= 6  # tokens arrive as separate chunks
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == 12 and usage["prompt_tokens"] > 5


async def test_models_are_merged_from_the_worker(make_router: RouterFactory) -> None:
    router = await make_router()
    async with aiohttp.ClientSession() as s, s.get(router.url + "/v1/models") as resp:
        assert resp.status == 200
        ids = [m["id"] for m in (await resp.json())["data"]]
    assert ids == [MODEL_NAME]
