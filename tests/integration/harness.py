"""Loopback scenarios of the agent harnesses' API shapes through ``progrouter serve`` (enable key ``auto``)
and an emulator with two DP Ranks: each harness's sessions become the expected Programs, stay on one Rank,
hit the prefix cache on later turns, wait in the pool under pressure, and get the engine's own answer."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from progrouter.program.core.diagnostics import redact
from progrouter.workload.apis import ApiName, RenderInput, make_client
from progrouter.workload.prompts import PromptBuilder
from progrouter.workload.replay import ReplayOptions, ReplayResult, replay
from progrouter.workload.trace import Trace
from support.agent_sessions import (
    Turn,
    check_cache_hits,
    check_exact_usage,
    check_programs_on_one_rank,
    diagnostics,
    listed,
    listed_key,
    session_trace,
)
from support.factories import EngineFactory, RouterFactory

from .helpers import CAPACITY, ENGINE_DEFAULTS, MODEL, wait_until

TIME_SCALE = float(ENGINE_DEFAULTS["time_scale"])
#: The last event of each API's stream.
STREAM_END = {
    "messages": b'"type":"message_stop"}',
    "responses": b'"type":"response.completed"}',
    "chat-session": b"data: [DONE]",
}


def program_config(**overrides: Any) -> dict[str, Any]:
    return {
        "enable_key": "auto",
        "token_capacity_per_dp_rank": CAPACITY,
        "metrics_interval_seconds": 0.1,
        **overrides,
    }


@dataclass
class Fleet:
    """Where clients send requests, where the scheduler's diagnostics are, and the engine behind it."""

    url: str
    admin_url: str


async def two_ranks(make_engine: EngineFactory, api: ApiName) -> tuple[list[str], int]:
    """Two Ranks for ``api``'s sessions: the worker URLs and the DP size behind each. vLLM's Responses
    handler ignores the ``X-data-parallel-rank`` header (so does the emulator), so a Responses Program is
    kept on one Rank only where each Rank is a worker URL of its own — as the Codex guide deploys it."""
    if api == "responses":
        return [(await make_engine(data_parallel_size=1)).url for _ in range(2)], 1
    return [(await make_engine(data_parallel_size=2)).url], 2


async def start(
    make_engine: EngineFactory, make_router: RouterFactory, api: ApiName | None = None, **program: Any
) -> Fleet:
    """The router in front of two Ranks: as ``two_ranks`` lays them out for ``api``, else one emulator
    with two DP Ranks."""
    urls, dp = await two_ranks(make_engine, api or "chat")
    router = await make_router(urls, program_config(**program), intra_node_data_parallel_size=dp)
    return Fleet(router.url, router.url)


async def run(api: ApiName, url: str, trace: Trace) -> ReplayResult:
    result = await replay(trace, ReplayOptions(url=url, api=api, model=MODEL, time_scale=TIME_SCALE))
    failed = [(f.request_id, f.status_code, f.error) for f in result.facts if not f.ok]
    assert not failed, failed
    assert len(result.facts) == trace.num_requests
    return result


async def sessions_become_programs_on_one_rank_with_cache_hits(
    api: ApiName, fleet: Fleet, client: aiohttp.ClientSession
) -> None:
    """Two sessions, each a lead and a subagent, concurrently: the Programs the headers name, each on one
    Rank, cache hits on later turns, and the usage the scheduler recorded is the usage the client read."""
    trace = session_trace(2)
    result = await run(api, fleet.url, trace)
    d = await wait_until(
        lambda: diagnostics(client, fleet.admin_url),
        lambda d: all(r["router_in_flight_requests"] == 0 for r in d["ranks"]),
    )
    placement = check_programs_on_one_rank(api, trace, d)
    for fact in result.facts:
        assert fact.prompt_tokens is not None and fact.prompt_tokens >= fact.input_tokens
        assert fact.output_tokens == fact.planned_output_tokens
        assert fact.first_token_at is not None and fact.first_token_at >= fact.started_at
    turns = [Turn.of_fact(f) for f in result.facts]
    check_cache_hits(turns)
    check_exact_usage(d, placement, turns)


async def sessions_wait_in_the_pool_under_pressure(
    api: ApiName, make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    """Six sessions of ~900 tokens on two Ranks of 3000: not all fit, so some wait in the pool; every
    request still completes."""
    engine = await make_engine(data_parallel_size=2)
    config = program_config(admission_waiting_request_threshold=0)
    router = await make_router([engine.url], config, intra_node_data_parallel_size=2)
    trace = session_trace(6, turns=2, base=48, grow=4, subagent=False)
    engine.server.set_fault(None, "stall")
    replaying = asyncio.create_task(run(api, router.url, trace))
    d = await wait_until(lambda: diagnostics(client, router.url), lambda d: d["retained_requests"] >= 1)
    assert d["programs"] < len(trace.tasks) or any(r["router_queued_programs"] for r in d["ranks"])
    engine.server.set_fault(None, "none")
    await asyncio.wait_for(replaying, 60)


async def answers_match_the_engine(
    api: ApiName, make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    """One session's turns through the router and straight to a twin engine on the Rank the router chose:
    the same bytes (streamed and not), but for the ``created`` timestamps."""
    fleet = await start(make_engine, make_router)
    twin = await make_engine(data_parallel_size=2)
    trace = session_trace(1, subagent=False)
    task = trace.tasks[0]
    client_api = make_client(api, trace, PromptBuilder(trace), MODEL)
    rank: str | None = None
    for step, request in enumerate(task.lead.requests):
        rendered = client_api.render(
            RenderInput(task, task.lead, step, request, f"{task.lead.program_id}:{step}")
        )
        for stream in (True, False):
            body = {**orjson.loads(rendered.body), "stream": stream}
            if not stream:
                body.pop("stream_options", None)
            via = await _post(client, fleet.url + rendered.path, rendered.headers, body)
            if rank is None:
                d = await diagnostics(client, fleet.admin_url)
                [rank] = [str(r["dp_rank"]) for r in d["ranks"] if r["programs"]]
            direct_headers = {**rendered.headers, "X-data-parallel-rank": rank}
            direct = await _post(client, twin.url + rendered.path, direct_headers, body)
            if stream:
                assert via.rstrip().endswith(STREAM_END[api]), via[-200:]
            else:
                assert orjson.loads(via)["usage"]
            assert _normalised(via) == _normalised(direct), (api, step, stream)


async def _post(client: aiohttp.ClientSession, url: str, headers: Mapping[str, str], body: Any) -> bytes:
    async with client.post(url, data=orjson.dumps(body), headers=dict(headers)) as response:
        data = await response.read()
        assert response.status == 200, data[:300]
        return data


def _normalised(raw: bytes) -> bytes:
    """The answer with every ``created``/``created_at`` timestamp zeroed (the only wall-clock field)."""
    return re.sub(rb'"(created|created_at)":\s*\d+', rb'"\1":0', raw)


async def body_session_becomes_a_program_with_identity_extensions(
    api: ApiName,
    drop: str,
    make_engine: EngineFactory,
    make_router: RouterFactory,
    client: aiohttp.ClientSession,
) -> None:
    """Beyond the spec: without its spec session header (``drop``), a harness's turns still become one
    Program under ``identity_extensions`` from what else the harness sends (Claude Code's
    ``metadata.user_id``), and none without it."""
    trace = session_trace(1, turns=2, subagent=False)
    task = trace.tasks[0]
    for extensions in (False, True):
        fleet = await start(make_engine, make_router, identity_extensions=extensions)
        client_api = make_client(api, trace, PromptBuilder(trace), MODEL)
        for step, request in enumerate(task.lead.requests):
            rendered = client_api.render(RenderInput(task, task.lead, step, request, f"r{step}"))
            headers = {k: v for k, v in rendered.headers.items() if k.lower() != drop.lower()}
            await _post(client, fleet.url + rendered.path, headers, orjson.loads(rendered.body))
        d = await diagnostics(client, fleet.admin_url)
        keys = [listed_key(e) for e in listed(d)]
        assert keys == ([(redact(task.task_id), None)] if extensions else []), (extensions, keys)
