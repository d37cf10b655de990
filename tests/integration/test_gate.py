"""ProgramGate in-process (no HTTP): the races between outcomes and cancellation, and the ticket contract."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from progrouter.config import ProgramSchedulingConfig, RouterConfig
from progrouter.program.types import InvalidIdentity, NoTargets
from progrouter.routing.target import Target
from progrouter.server.gate.program_gate import ProgramGate, ProgramTicket, model_pool_of

pytestmark = pytest.mark.timeout(30)

TARGET = Target.parse("http://127.0.0.1:9")
CHAT = "/v1/chat/completions"


def body(program: str, words: int = 400) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "abc " * words}],
        "vllm_xargs": {"agentic_context": json.dumps({"program_id": program})},
    }


@pytest.fixture
async def gate() -> AsyncIterator[ProgramGate]:
    # 400 words ≈ 410 estimated tokens + 100 decode buffer: one Program fits in 600, two do not.
    program = ProgramSchedulingConfig(token_capacity_per_dp_rank=600, metrics_interval_seconds=60.0)
    config = RouterConfig(worker_urls=[TARGET.base_url], program_scheduling=program)
    async with aiohttp.ClientSession() as session:
        g = ProgramGate(config, session, CollectorRegistry(), None)
        g.set_healthy_targets([TARGET])
        await g.start()
        yield g
        await g.stop()


async def acquire(
    gate: ProgramGate, b: dict[str, Any], headers: dict[str, str] | None = None
) -> ProgramTicket:
    ticket = await gate.acquire(route=CHAT, body=b, raw_body=json.dumps(b).encode(), headers=headers or {})
    assert ticket is not None
    return ticket


def used(gate: ProgramGate) -> int:
    tokens: int = gate.diagnostics()["ranks"][0]["router_estimated_used_tokens"]
    return tokens


async def retained(gate: ProgramGate, n: int) -> None:
    while gate.diagnostics()["retained_requests"] != n:
        await asyncio.sleep(0)


async def test_identity_free_requests_get_no_ticket_and_no_state(gate: ProgramGate) -> None:
    plain = {"model": "m", "messages": []}
    assert await gate.acquire(route=CHAT, body=plain, raw_body=b"{}", headers={"x-session-id": "s"}) is None
    assert gate.diagnostics()["ranks"] == []
    assert gate._observation is None  # no polling started


async def test_errors_propagate_as_schedule_errors(gate: ProgramGate) -> None:
    with pytest.raises(InvalidIdentity):
        await gate.acquire(route=CHAT, body={"vllm_xargs": 1}, raw_body=b"", headers={})
    gate.set_healthy_targets([])
    with pytest.raises(NoTargets):
        await acquire(gate, body("p"))


async def test_a_dispatch_that_races_with_cancellation_is_undone(gate: ProgramGate) -> None:
    first = await acquire(gate, body("prog-a"))
    second = asyncio.create_task(acquire(gate, body("prog-b")))
    await retained(gate, 1)
    # Finishing the first dispatches the second (its future resolves) — and its client leaves in the same
    # loop iteration, before the waiting task could run.
    first.observe_json(b'{"usage": {"prompt_tokens": 420, "completion_tokens": 3}}')
    first.finish(True)
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    d = gate.diagnostics()
    assert d["retained_requests"] == 0
    assert used(gate) == 0
    assert [p["in_flight_requests"] for p in d["ranks"][0]["programs"]] == [0, 0]
    # The estimator learnt from the successful completion.
    assert gate.diagnostics()["token_estimation"][0]["tokens_per_byte"] != 0.25


async def test_cancel_while_retained_withdraws_and_finish_is_idempotent(gate: ProgramGate) -> None:
    first = await acquire(gate, body("prog-a"))
    waiting = asyncio.create_task(acquire(gate, body("prog-b")))
    await retained(gate, 1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert gate.diagnostics()["retained_requests"] == 0
    assert gate.diagnostics()["programs"] == 1  # the unstarted Program was released
    assert first.target == TARGET
    first.finish(False)
    first.finish(True)  # ignored
    assert first.finished
    assert used(gate) == 0


async def test_sse_ticket_reports_usage_and_decode_time(gate: ProgramGate) -> None:
    ticket = await acquire(gate, body("prog-a"))
    ticket.observe_sse(b'data: {"choices": []}\n\ndata: {"usage": {"prompt_')
    ticket.observe_sse(b'tokens": 800, "completion_tokens": 2}}\n\n')
    ticket.finish(True)
    (estimate,) = gate.diagnostics()["token_estimation"]
    assert estimate["endpoint"] == CHAT
    assert estimate["tokens_per_byte"] > 0.25  # 800 reported for ~1640 bytes: the coefficient moved up


def test_model_pools() -> None:
    assert model_pool_of({"model": "llama"}) == "program:model:llama"
    assert model_pool_of({"model": ""}) == "program:all"
    assert model_pool_of(None) == "program:all"


@pytest.mark.parametrize("strategy", ["consistent_hash", "least_program_count"])
async def test_long_bodies_bind_by_their_digest_only_under_consistent_hash(strategy: str) -> None:
    """consistent_hash places a Program without a session header by its body's digest, so distinct
    Programs spread over the Ranks; the other strategies never read the key (its digest is not computed)."""
    targets = [Target.parse("http://127.0.0.1:9"), Target.parse("http://127.0.0.1:10")]
    program = ProgramSchedulingConfig(binding_strategy=strategy, metrics_interval_seconds=60.0)
    config = RouterConfig(worker_urls=[t.base_url for t in targets], program_scheduling=program)
    async with aiohttp.ClientSession() as session:
        g = ProgramGate(config, session, CollectorRegistry(), None)
        g.set_healthy_targets(targets)
        await g.start()
        try:
            assert g.scheduler.binding_reads[1] is (strategy == "consistent_hash")
            tickets = [await acquire(g, body(f"p{i}", words=50 + i)) for i in range(16)]
            assert len({t.target.id for t in tickets}) == 2  # spread: by digest, or to the least loaded
            for ticket in tickets:
                ticket.finish(True)
        finally:
            await g.stop()
