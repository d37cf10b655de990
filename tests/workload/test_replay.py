"""Closed-loop replay against an in-process fake server: ordering, blocking, request shape, facts."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from progrouter.workload.replay import ReplayOptions, replay

from .fake_engine import FakeEngine, Seen, running
from .traces import tree_trace

pytestmark = pytest.mark.timeout(60)
EPS = 1e-3


async def test_closed_loop_order_gaps_and_blocking() -> None:
    trace = tree_trace(2)
    loop = asyncio.get_running_loop()
    # one release per task: a task whose lead got ahead must not release the other task's subagent
    released = {t.task_id: loop.create_future() for t in trace.tasks}

    def hold(s: Seen) -> asyncio.Future[None] | None:
        # The non-blocking subagent is held until its lead's last request has arrived: if the replay
        # wrongly waited for it, nothing would release it and the replay would time out.
        task_id = s.program_id.split(":", 1)[0]
        if s.program_id.endswith(":lead") and s.step == 2 and not released[task_id].done():
            released[task_id].set_result(None)
        if s.program_id.endswith(":sub-f"):
            return asyncio.ensure_future(asyncio.wait_for(asyncio.shield(released[task_id]), 20))
        return None

    async with running(FakeEngine(hold=hold, delay=0.005)) as fake:
        result = await replay(trace, ReplayOptions(url=fake.url))
    assert not result.interrupted
    assert len(result.facts) == trace.num_requests == len(fake.seen)
    assert all(f.ok for f in result.facts)
    progs = fake.by_program()
    for task in trace.tasks:
        for p in task.programs:
            seen = progs[p.program_id]
            assert [s.step for s in seen] == list(range(len(p.requests)))  # one at a time, in order
            for prev, cur, r in zip(seen, seen[1:], p.requests[1:], strict=False):
                assert prev.ended is not None and cur.arrived >= prev.ended + r.gap - EPS
        lead = progs[f"{task.task_id}:lead"]
        sub_b = progs[f"{task.task_id}:sub-b"]
        sub_f = progs[f"{task.task_id}:sub-f"]
        lead0_end = lead[0].ended
        assert lead0_end is not None
        assert sub_b[0].arrived >= lead0_end + 0.01 - EPS  # spawned after the lead's first request
        assert sub_f[0].arrived >= lead0_end - EPS
        assert sub_b[-1].ended is not None and lead[1].arrived >= sub_b[-1].ended - EPS  # blocked
        assert sub_f[0].ended is not None and lead[2].arrived < sub_f[0].ended  # not blocked
    jct = {t: result.task_end[t] - result.task_start[t] for t in result.task_start}
    assert set(jct) == {"t0", "t1"}


async def test_request_shape_and_deterministic_prompts() -> None:
    trace = tree_trace(2)
    async with running(FakeEngine()) as fake:
        await replay(trace, ReplayOptions(url=fake.url))
    s = {(x.program_id, x.step): x for x in fake.seen}
    first = s[("t0:lead", 0)]
    body, ctx = first.body, first.context
    assert body["model"] == "fake-model"
    assert body["max_tokens"] == body["min_tokens"] == 3 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert isinstance(body["vllm_xargs"]["agentic_context"], str)  # the string form stock vLLM accepts
    assert ctx == {
        "program_id": "t0:lead",
        "task_id": "t0",
        "agent_id": "lead",
        "agent_role": "lead",
        "step_id": 0,
        "request_id": "t0:lead:0",
        "blocks_parent": False,
    }
    sub = s[("t0:sub-b", 1)].context
    assert sub["parent_program_id"] == "t0:lead" and sub["blocks_parent"] is True and sub["step_id"] == 1
    assert first.headers["x-session-id"] == "t0"
    p0, p1 = first.body["prompt"], s[("t0:lead", 1)].body["prompt"]
    assert len(p0) == 48 and len(p1) == 64 and p1[:48] == p0  # the context grows by appending
    other = s[("t1:lead", 0)].body["prompt"]
    assert other[:32] == p0[:32]  # blocks 0 and 1 are shared across tasks
    assert other[32:48] != p0[32:48]  # block 10 is task-private: salted per task


async def test_a_retention_hint_rides_in_every_context_in_wall_seconds() -> None:
    async with running(FakeEngine()) as fake:
        await replay(tree_trace(1), ReplayOptions(url=fake.url, time_scale=4.0, kv_retention_hint=60.0))
    assert fake.seen and {x.context["kv_retention_ttl_seconds"] for x in fake.seen} == {15.0}


async def test_facts_carry_usage_and_errors() -> None:
    trace = tree_trace(1)
    async with running(FakeEngine(fail_programs={"t0:sub-f"})) as fake:
        result = await replay(trace, ReplayOptions(url=fake.url, time_scale=4.0))
    facts = {f.request_id: f for f in result.facts}
    bad = facts["t0:sub-f:0"]
    assert bad.status == "error" and bad.status_code == 500 and "boom" in (bad.error or "")
    ok = facts["t0:lead:1"]
    assert ok.ok and ok.prompt_tokens == 64 and ok.output_tokens == 3 and ok.cached_tokens == 48
    assert ok.ttft is not None and 0 <= ok.ttft <= ok.latency
    assert ok.rank == 1 and ok.time_scale == 4.0
    assert ok.headers_at is not None and ok.started_at <= ok.headers_at <= ok.finished_at
    assert sum(f.ok for f in result.facts) == trace.num_requests - 1  # the failure did not stop the rest


async def test_chat_api_sends_one_word_per_token() -> None:
    trace = tree_trace(1)
    async with running(FakeEngine()) as fake:
        await replay(trace, ReplayOptions(url=fake.url, api="chat", model="m"))
    first = next(x for x in fake.seen if x.program_id == "t0:lead" and x.step == 0)
    assert first.body["model"] == "m"
    words = first.body["messages"][0]["content"].split()
    assert len(words) == 48 and all(w.startswith("t") for w in words)


async def test_stop_keeps_finished_facts_and_cancels_in_flight() -> None:
    trace = tree_trace(1)
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    written: list[bytes] = []

    def hold(s: Seen) -> asyncio.Future[None] | None:
        if s.program_id.endswith(":lead") and s.step == 1:
            stop.set()  # stop while this request is in flight
            return never
        return None

    async with running(FakeEngine(hold=hold)) as fake:
        result = await replay(trace, ReplayOptions(url=fake.url), lambda f: written.append(f.to_json()), stop)
        never.set_result(None)
    assert result.interrupted
    statuses = {orjson.loads(w)["request_id"]: orjson.loads(w)["status"] for w in written}
    assert statuses["t0:lead:0"] == "ok"
    assert statuses["t0:lead:1"] == "cancelled"
    assert "t0:lead:2" not in statuses
