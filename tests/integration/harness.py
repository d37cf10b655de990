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

from progrouter.program.diagnostics import redact
from progrouter.server.runner import RunningRouter
from progrouter.workload.apis import ApiName, RenderInput, make_client
from progrouter.workload.apis.chat_session import session_id
from progrouter.workload.prompts import PromptBuilder
from progrouter.workload.replay import ReplayOptions, ReplayResult, replay
from progrouter.workload.trace import AgentRole, Trace, TraceProgram, TraceTask
from support.factories import EngineFactory, RouterFactory
from workload.traces import req

from .helpers import CAPACITY, ENGINE_DEFAULTS, MODEL, programs, wait_until

BLOCK = 16
SYSTEM = list(range(8))  # 128 tokens of system prompt every session shares
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


def session_task(
    task_id: str, *, turns: int = 4, grow: int = 6, base: int = 4, subagent: bool = True
) -> TraceTask:
    """A lead whose context grows by ``grow`` blocks a turn (a tool result each), and a blocking subagent
    spawned after its first turn (two turns of its own)."""
    own = 1000 * (1 + int(task_id.lstrip("t")))
    lead = TraceProgram(
        f"{task_id}:lead",
        "lead",
        AgentRole.LEAD,
        tuple(req([*SYSTEM, *range(own, own + base + grow * i)], out=4) for i in range(turns)),
    )
    if not subagent:
        return TraceTask(task_id, 0.0, (lead,))
    sub = TraceProgram(
        f"{task_id}:sub-1",
        "sub-1",
        AgentRole.SUBAGENT,
        tuple(req([*SYSTEM, *range(own + 500, own + 502 + 3 * i)], out=4) for i in range(2)),
        parent_program_id=lead.program_id,
        blocks_parent=True,
        spawn_after=0,
    )
    return TraceTask(task_id, 0.0, (lead, sub))


def session_trace(tasks: int, **kw: Any) -> Trace:
    return Trace(BLOCK, tuple(session_task(f"t{i}", **kw) for i in range(tasks)), frozenset(SYSTEM))


def expected_key(api: ApiName, task: TraceTask, program: TraceProgram) -> tuple[str | None, str | None]:
    """(task, agent) of the Program the router derives from the harness's headers, redacted as the
    diagnostics show them."""
    if api == "chat-session":  # a subagent is a session of its own, with no agent header
        item = RenderInput(task, program, 0, program.requests[0], "")
        return redact(session_id(item)), None
    lead = program.parent_program_id is None  # a lead sends no agent header
    return redact(task.task_id), None if lead else redact(program.agent_id)


def listed_key(entry: Mapping[str, Any]) -> tuple[str | None, str | None]:
    return entry["task_id"], entry["agent_id"]


async def diagnostics(client: aiohttp.ClientSession, router: RunningRouter) -> dict[str, Any]:
    async with client.get(router.url + "/scheduling/diagnostics") as response:
        assert response.status == 200
        data: dict[str, Any] = await response.json()
        return data


@dataclass
class Fleet:
    router: RunningRouter
    engine_url: str


async def start(make_engine: EngineFactory, make_router: RouterFactory, **program: Any) -> Fleet:
    engine = await make_engine(data_parallel_size=2)
    router = await make_router([engine.url], program_config(**program), intra_node_data_parallel_size=2)
    return Fleet(router, engine.url)


async def run(api: ApiName, url: str, trace: Trace) -> ReplayResult:
    result = await replay(trace, ReplayOptions(url=url, api=api, model=MODEL, time_scale=TIME_SCALE))
    failed = [(f.request_id, f.status_code, f.error) for f in result.facts if not f.ok]
    assert not failed, failed
    assert len(result.facts) == trace.num_requests
    return result


async def sessions_become_programs_on_one_rank_with_cache_hits(
    api: ApiName, make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    fleet = await start(make_engine, make_router)
    trace = session_trace(2)
    result = await run(api, fleet.router.url, trace)
    d = await wait_until(
        lambda: diagnostics(client, fleet.router),
        lambda d: all(r["router_in_flight_requests"] == 0 for r in d["ranks"]),
    )
    listed = programs(d)
    expected = sorted((expected_key(api, task, p) for task in trace.tasks for p in task.programs), key=repr)
    assert sorted((listed_key(e) for e in listed), key=repr) == expected, listed
    for entry in listed:
        assert entry["home_target"] == entry["last_target"]  # every turn went to the one Rank
        assert sum(entry in r["programs"] for r in d["ranks"]) == 1
    subs = [e for e in listed if e["agent_role"] == "subagent"]
    if api == "chat-session":  # a child session is a lead of its own
        assert subs == []
    else:  # a harness subagent is linked to its lead by the agent headers
        assert len(subs) == len(trace.tasks)
        leads = {redact(f"{t.task_id}:lead") for t in trace.tasks}
        assert {e["parent_program_id"] for e in subs} == leads
        assert all(e["blocks_parent"] for e in subs)
    for fact in result.facts:
        assert fact.prompt_tokens is not None and fact.prompt_tokens >= fact.input_tokens
        assert fact.output_tokens == fact.planned_output_tokens
        assert fact.first_token_at is not None and fact.first_token_at >= fact.started_at
        if fact.step_id > 0:  # the turn extends the last one, on the same Rank: its prefix is cached
            assert fact.cached_tokens is not None and fact.cached_tokens > 0, fact


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
    d = await wait_until(lambda: diagnostics(client, router), lambda d: d["retained_requests"] >= 1)
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
            via = await _post(client, fleet.router.url + rendered.path, rendered.headers, body)
            if rank is None:
                d = await diagnostics(client, fleet.router)
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
            await _post(client, fleet.router.url + rendered.path, headers, orjson.loads(rendered.body))
        d = await diagnostics(client, fleet.router)
        keys = [listed_key(e) for e in programs(d)]
        assert keys == ([(redact(task.task_id), None)] if extensions else []), (extensions, keys)
