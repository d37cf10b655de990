"""SIGTERM to a ``progrouter serve`` subprocess with requests in flight and in the pool: a graceful drain.

Expected (the documented drain): ``/readiness`` turns 503 at once and new requests get 503; streams already
relayed finish whole; Program requests still waiting in the pool get a retryable 503; the process exits 0.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest

from integration.helpers import wait_until
from support.agents import AgentPlan, Tally, body_for, send
from support.processes import EngineProcess, RouterProcess
from support.tapped_engine import read_arrivals

from .conftest import RAW_IDS
from .harness import ENGINE_FLAGS, PROGRAM, SLACK, redispatched_after_bytes

pytestmark = pytest.mark.timeout(90)
SLOW = [*ENGINE_FLAGS[:-1], "1"]  # time scale 1: a 120-token stream takes over a second


@pytest.fixture
async def engines(tmp_path: Path) -> AsyncIterator[list[EngineProcess]]:
    procs = [EngineProcess(SLOW, tmp_path / f"tap-{i}.jsonl") for i in range(2)]
    try:
        await asyncio.gather(*(p.start() for p in procs))
        yield procs
    finally:
        for p in procs:
            await p.stop()


async def test_sigterm_drains_in_flight_and_pooled_requests(
    engines: list[EngineProcess], report: Callable[[Tally], None]
) -> None:
    router = RouterProcess(
        [e.url for e in engines],
        {**PROGRAM, "token_capacity_per_dp_rank": 700},
        request_timeout_secs=20,
        health_check_interval_secs=0.5,
    )
    await router.start()
    tally = Tally()
    budget = 30.0
    try:
        async with aiohttp.ClientSession() as session:
            plans = [AgentPlan(f"s{i}-drain", max_tokens=120) for i in range(6)]
            plans += [AgentPlan(f"n{i}-native", program=False, max_tokens=120) for i in range(2)]
            load = [
                asyncio.create_task(
                    send(
                        session,
                        router.url,
                        body_for(p, 0, True),
                        program=p.program,
                        budget=budget,
                        tally=tally,
                    )
                )
                for p in plans
            ]

            async def streaming() -> int:
                return sum(len(read_arrivals(e.tap_log)) for e in engines)

            async def readiness() -> int:
                try:
                    async with session.get(router.url + "/readiness") as r:
                        return r.status
                except aiohttp.ClientError:
                    return -1  # not listening any more: no drain at all

            try:
                await wait_until(streaming, lambda n: n >= 4, timeout=15.0)
                async with session.get(router.url + "/scheduling/diagnostics") as r:
                    assert (await r.json())["retained_requests"] > 0  # some requests wait in the pool
                await router.signal(signal.SIGTERM)
                assert await wait_until(readiness, lambda s: s == 503, timeout=2.0) == 503
                turn = body_for(plans[0], 1, False)
                late = await send(session, router.url, turn, program=True, budget=budget, tally=tally)
                assert late.status == 503, (late.status, late.detail)
            finally:  # whatever failed above, every request sent ends (and is counted) as it really does
                await asyncio.gather(*load)
            code = await router.wait(timeout=budget + SLACK)
    finally:
        await router.stop()
        report(tally)
    assert code == 0, "".join(router.output[-20:])
    assert not tally.lost(), [(r.rid, r.detail) for r in tally.lost()]
    relayed = [r for r in tally.records if r.first_byte is not None and r.status == 200]
    assert relayed and all(r.outcome == "completed" for r in relayed), [(r.rid, r.detail) for r in relayed]
    pooled = [r for r in tally.records if r.status not in (200, None)]
    assert all(r.status == 503 for r in pooled), [(r.status, r.detail) for r in pooled]
    assert not redispatched_after_bytes(tally, [e.tap_log for e in engines])
    assert not [line for line in router.output if RAW_IDS.search(line)]  # its log, at INFO
