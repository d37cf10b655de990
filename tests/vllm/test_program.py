"""Program scheduling before real vLLM: DP-Rank dispatch, usage into the scheduler, backend observation."""

from __future__ import annotations

import asyncio
import logging
import random
import time
import urllib.request
import uuid
from typing import Any

import aiohttp
import pytest

from integration.helpers import wait_until
from progrouter.observe.vllm_metrics import observations_for_targets, parse_vllm_metrics
from progrouter.program.types import BackendObservation
from progrouter.routing.target import Target, expand_targets
from support.factories import RouterFactory

from .conftest import BLOCK_SIZE, KV_TOKENS_PER_RANK, MODEL_NAME, VOCAB_SIZE, VllmServer
from .helpers import agentic, diagnostics, engine_counters, read_sse

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
INTERVAL = 0.2


def program_config(**overrides: Any) -> dict[str, Any]:
    return {
        "token_capacity_per_dp_rank": KV_TOKENS_PER_RANK,
        "metrics_interval_seconds": INTERVAL,
    } | overrides


def fresh_ids(n: int) -> list[int]:
    """Token ids no earlier request used (the server lives for the whole session)."""
    rng = random.Random(uuid.uuid4().int)
    return [rng.randrange(100, VOCAB_SIZE - 100) for _ in range(n)]


def rank_of(diag: dict[str, Any], target_id: str) -> dict[str, Any]:
    return next(r for r in diag["ranks"] if r["target_id"] == target_id)


def the_program(diag: dict[str, Any]) -> dict[str, Any]:
    programs: list[dict[str, Any]] = [p for r in diag["ranks"] for p in r["programs"]]
    assert len(programs) == 1, programs
    return programs[0]


async def test_program_conversation_hits_the_prefix_cache_on_its_rank(
    make_router: RouterFactory, vllm_server: VllmServer
) -> None:
    router = await make_router(program_config())
    turn1 = fresh_ids(1000)
    turn2 = turn1 + fresh_ids(200)  # the tool result appended to the same context
    context = agentic(f"conv-{uuid.uuid4().hex[:8]}", task_id="t1")
    async with aiohttp.ClientSession() as s:
        before = await engine_counters(s, vllm_server.url)
        body = {"model": MODEL_NAME, "prompt": turn1, "max_tokens": 8, "min_tokens": 8, "ignore_eos": True}
        async with s.post(router.url + "/v1/completions", json=body | {"vllm_xargs": context}) as resp:
            assert resp.status == 200, await resp.text()
            usage1 = (await resp.json())["usage"]
        stream = {"stream": True, "stream_options": {"include_usage": True}, "prompt": turn2}
        async with s.post(
            router.url + "/v1/completions", json=body | stream | {"vllm_xargs": context}
        ) as resp:
            assert resp.status == 200
            events, done = await read_sse(resp)
        assert done
        usage2 = events[-1]["usage"]
        after = await engine_counters(s, vllm_server.url)
        # The client may read [DONE] a moment before the router sees the worker's stream end, which is when
        # the request is completed: wait for that rather than race it.
        diag = await wait_until(
            lambda: diagnostics(s, router.url), lambda d: the_program(d)["completed_requests"] == 2, 5.0
        )

    assert usage1["prompt_tokens_details"]["cached_tokens"] == 0
    assert usage2["prompt_tokens"] == 1200
    # The second turn reuses every whole block of the first: the Program stayed on its Rank.
    assert usage2["prompt_tokens_details"]["cached_tokens"] == (1000 // BLOCK_SIZE) * BLOCK_SIZE

    program = the_program(diag)
    target = program["last_target"]
    assert target == program["home_target"]
    rank = int(target.rsplit("@", 1)[1])
    other = str(1 - rank)
    grew = {e: after[e]["vllm:prompt_tokens_total"] - before[e]["vllm:prompt_tokens_total"] for e in after}
    # X-data-parallel-rank steered both turns to the engine the scheduler chose, and only there.
    assert grew == {str(rank): 2200.0, other: 0.0}
    cached = (
        after[str(rank)]["vllm:prompt_tokens_cached_total"]
        - before[str(rank)]["vllm:prompt_tokens_cached_total"]
    )
    assert cached == 992.0

    # vLLM's usage (prompt, completion, cached) reached the scheduler's accounting.
    assert program["completed_requests"] == 2
    assert program["estimated_context_tokens"] >= 1200
    rolling = rank_of(diag, target)["rolling"]
    assert rolling["request_samples"] == 2
    assert rolling["avg_prompt_tokens"] == 1100.0
    assert rolling["avg_cached_prompt_tokens"] == 496.0
    assert rolling["avg_completion_tokens"] == 8.0
    assert rank_of(diag, f"{vllm_server.url}@{other}")["rolling"]["request_samples"] == 0


def _scrape_until_running(
    base_url: str, targets: list[Target], seconds: float
) -> dict[str, BackendObservation] | None:
    """Blocking scrapes from a thread, parsed by the router's own code, until a Rank runs a request.

    A thread with blocking sockets keeps waking on time while vLLM decodes; the event loop does not (see
    the test's docstring).
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with urllib.request.urlopen(base_url + "/metrics", timeout=30) as response:
            text = response.read().decode()
        observed = observations_for_targets(targets, parse_vllm_metrics(text))
        if any(o.running == 1 for o in observed.values()):
            return observed
        time.sleep(0.1)
    return None


async def test_backend_observation_parses_real_metrics_per_engine(
    make_router: RouterFactory, vllm_server: VllmServer
) -> None:
    """The real /metrics, parsed per `engine` label and mapped to Ranks, feeds the router's accounting.

    Two phases, because of a property of this machine: while vLLM decodes, its lockstep DP engines keep both
    cores busy and an asyncio event loop here can sleep in epoll for up to ~13 s past its timers while using
    no CPU (measured with an event-loop lag probe; `nice` and pinning did not help). The router's 2 s scrape
    then times out, so its freshness cannot be asserted *during* a decode. So: during the decode the
    router's parsing and engine→Rank mapping code reads the busy server's real /metrics (fetched from a
    thread); once vLLM is idle, the router's own loop must show fresh backend observations on both Ranks.
    """
    router = await make_router(program_config())
    body = {
        "model": MODEL_NAME,
        "prompt": fresh_ids(2000),
        "max_tokens": 6000,  # ~25 s of decoding
        "min_tokens": 6000,
        "ignore_eos": True,
        "stream": True,
        "vllm_xargs": agentic(f"obs-{uuid.uuid4().hex[:8]}"),
    }
    targets = expand_targets([vllm_server.url], 2)
    async with aiohttp.ClientSession() as s:
        long_request = asyncio.create_task(_stream(s, router.url, body))
        busy = await asyncio.to_thread(_scrape_until_running, vllm_server.url, targets, 120.0)
        assert await long_request
        deadline = time.monotonic() + 60
        diag = await diagnostics(s, router.url)
        # Idle: a fresh observation taken after the request ended (one taken just before still says 1).
        while len(diag["ranks"]) != 2 or not all(
            r["observation_fresh"] and r["vllm_running_requests"] == 0 for r in diag["ranks"]
        ):
            assert time.monotonic() < deadline, f"no fresh observation once idle: {diag['ranks']}"
            await asyncio.sleep(INTERVAL)
            diag = await diagnostics(s, router.url)
    assert busy is not None, "no scrape saw the running request"
    assert set(busy) == {t.id for t in targets}
    busy_id = next(t for t, o in busy.items() if o.running == 1)
    idle = next(o for t, o in busy.items() if t != busy_id)
    program = the_program(diag)
    assert busy_id == program["last_target"]  # the engine label matched to the Program's Rank
    assert idle.running == 0 and idle.kv_cache_usage == 0.0
    # 2000 prompt tokens + up to 6000 generated of 16,384 KV tokens, in 32-token blocks.
    assert 0.12 <= busy[busy_id].kv_cache_usage <= 0.5
    ranks = {r["target_id"]: r for r in diag["ranks"]}
    assert set(ranks) == {t.id for t in targets}
    for r in ranks.values():
        assert r["capacity_accounting_source"] == "backend_observation"
        assert r["observation_fresh"] is True
        assert r["configured_token_capacity"] == KV_TOKENS_PER_RANK


async def test_an_unset_token_capacity_names_real_vllms_kv_size_per_rank(
    make_router: RouterFactory, vllm_server: VllmServer, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM 0.32 with two Ranks labels each engine with the summed block count but its own token size."""
    caplog.set_level(logging.INFO, logger="progrouter")
    router = await make_router(program_config(token_capacity_per_dp_rank=None))
    body = {
        "model": MODEL_NAME,
        "prompt": fresh_ids(64),
        "max_tokens": 4,
        "vllm_xargs": agentic(f"cap-{uuid.uuid4().hex[:8]}"),
    }

    def told() -> list[str]:
        return [r.getMessage() for r in caplog.records if "event=token_capacity_unset" in r.getMessage()]

    async with aiohttp.ClientSession() as s:
        async with s.post(router.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
        await wait_until(lambda: asyncio.sleep(0, told()), bool, timeout=60.0)
    (line,) = told()
    assert f"reported_kv_tokens_per_dp_rank={KV_TOKENS_PER_RANK}" in line


async def _stream(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> bool:
    async with s.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        _events, done = await read_sse(resp)
        return done
