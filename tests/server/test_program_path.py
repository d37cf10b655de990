"""The proxy's Program-scheduling branch with the real ProgramGate: tickets, refusals, fallbacks, cleanup."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest

from progrouter.config import ProgramSchedulingConfig
from support.factories import RouterFactory

from .conftest import WorkerFactory
from .test_errors import _closed_port_url


def _program_body(task: str, agent: str = "lead", **extra: Any) -> dict[str, Any]:
    context = json.dumps({"task_id": task, "agent_id": agent})
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "vllm_xargs": {"agentic_context": context},
        **extra,
    }


def _in_flight(diagnostics: dict[str, Any]) -> int:
    return sum(int(rank["router_in_flight_requests"]) for rank in diagnostics["ranks"])


async def _diagnostics(client: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with client.get(url + "/scheduling/diagnostics") as resp:
        assert resp.status == 200
        result: dict[str, Any] = await resp.json()
        return result


async def test_program_requests_go_to_their_rank_and_others_route_natively(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    w0, w1 = await make_worker(), await make_worker()
    router = await make_router(
        [w0.url, w1.url], intra_node_data_parallel_size=2, program_scheduling=ProgramSchedulingConfig()
    )
    seen = set()
    for step in range(4):
        body = _program_body("task-a", step=step)
        async with client.post(router.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            seen.add(resp.headers["X-Worker"])
    assert len(seen) == 1  # one Program, one Rank
    program_requests = [r for w in (w0, w1) for r in w.requests]
    assert len({r["headers"]["X-data-parallel-rank"] for r in program_requests}) == 1
    assert all(b"agentic_context" in r["raw"] for r in program_requests)  # forwarded unchanged

    for _ in range(4):  # no identity: native round robin over all four Ranks
        async with client.post(router.url + "/v1/chat/completions", json={"messages": []}) as resp:
            assert resp.status == 200
    native = {
        (w.name, r["headers"]["X-data-parallel-rank"])
        for w in (w0, w1)
        for r in w.requests
        if b"agentic_context" not in r["raw"]
    }
    assert native == {("w0", "0"), ("w0", "1"), ("w1", "0"), ("w1", "1")}
    assert len(w0.requests) + len(w1.requests) == 8
    assert _in_flight(await _diagnostics(client, router.url)) == 0


async def test_invalid_identity_is_a_json_400(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], program_scheduling=ProgramSchedulingConfig())
    body = {"messages": [], "vllm_xargs": {"agentic_context": "not json"}}
    async with client.post(router.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["code"] == 400 and error["message"].startswith("invalid Program identity")
    assert worker.requests == []


async def test_unreachable_rank_is_502_and_the_ticket_is_finished(
    make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    router = await make_router(
        [_closed_port_url()], retry_max_retries=1, program_scheduling=ProgramSchedulingConfig()
    )
    async with client.post(router.url + "/v1/chat/completions", json=_program_body("task-b")) as resp:
        assert resp.status == 502
        assert "unreachable" in (await resp.json())["error"]["message"]
    assert _in_flight(await _diagnostics(client, router.url)) == 0


async def test_client_disconnect_mid_stream_finishes_the_ticket(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], program_scheduling=ProgramSchedulingConfig())
    resp = await client.post(
        router.url + "/v1/chat/completions", json=_program_body("task-c", test_mode="sse")
    )
    assert await resp.content.readuntil(b"\n\n") == b'data: {"n": 1}\n\n'
    assert _in_flight(await _diagnostics(client, router.url)) == 1
    resp.close()
    await asyncio.wait_for(worker.cancelled.wait(), timeout=5)

    async def drained() -> None:
        while _in_flight(await _diagnostics(client, router.url)) != 0:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(drained(), timeout=5)


async def test_startup_logs_the_reference_calibration_warning(
    make_worker: WorkerFactory, make_router: RouterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    worker = await make_worker()
    with caplog.at_level(logging.WARNING, logger="progrouter.program"):
        await make_router([worker.url], program_scheduling=ProgramSchedulingConfig())
    records = [
        r for r in caplog.records if getattr(r, "event", None) == "program_scheduling_reference_calibration"
    ]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    fields = records[0].fields  # type: ignore[attr-defined]
    assert fields["reference_prefill_seconds"] == pytest.approx(13.93, abs=0.005)
    assert fields["reference_decode_throughput_tokens_per_second"] == pytest.approx(98.23, abs=0.005)
    assert "reference_prefill_seconds=13.93" in records[0].getMessage()
