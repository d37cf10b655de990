"""Engine faults under concurrent agent load: kill -9 and restart, 5xx bursts, stalls, cut streams, /metrics.

Each test drives six Program agents (room for about four) and two native agents, alternating streaming
and non-streaming turns, injects its fault while they run, and then checks every invariant in
``harness.check_invariants``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import pytest

from integration.helpers import wait_until
from support.agents import Tally
from support.tapped_engine import read_arrivals

from .conftest import RigFactory
from .harness import Rig, check_invariants, drive, mixed_agents

pytestmark = pytest.mark.timeout(90)


async def _health(rig: Rig) -> int:
    status, _ = await rig.get_json("/health")
    return status


async def _arrivals_at_least(rig: Rig, index: int | None, n: int) -> None:
    """Wait until engine ``index`` (None: all of them together) has seen ``n`` tapped requests."""
    engines = rig.engines if index is None else [rig.engines[index]]

    async def count() -> int:
        return sum(len(read_arrivals(e.tap_log)) for e in engines)

    await wait_until(count, lambda c: c >= n, timeout=15.0)


@pytest.mark.parametrize("data_parallel", [1, 2], ids=["dp1", "dp2"])
async def test_rank_killed_mid_stream_and_restarted_on_the_same_port(
    make_rig: RigFactory, report: Callable[[Tally], None], data_parallel: int
) -> None:
    """SIGKILL one engine process (all its Ranks) while streams run; restart it on the same port."""
    rig, _ = await make_rig(data_parallel=data_parallel)
    victim = rig.engines[0]
    port = victim.port

    async def fault(tally: Tally) -> None:
        async def streaming_from_victim() -> bool:
            on_victim = {a["id"] for a in read_arrivals(victim.tap_log)}
            relaying = any(
                r.stream and r.first_byte is not None and r.elapsed is None and r.rid in on_victim
                for r in tally.records
            )
            if not relaying:
                return False
            async with rig.session.get(victim.url + "/server_info") as r:  # still generating, not just sent
                running: int = sum(rank["running"] for rank in (await r.json())["ranks"])
            return running > 0

        await wait_until(streaming_from_victim, bool, timeout=15.0)  # a stream from it is being relayed
        await victim.kill()
        await wait_until(lambda: _health(rig), lambda s: s == 503, timeout=10.0)
        _, health = await rig.get_json("/health")
        assert health["unhealthy_workers"] == [victim.url]
        ranks = {r["base_url"] for r in (await rig.diagnostics())["ranks"]}
        assert ranks == {rig.engines[1].url}  # the dead worker's Ranks left the scheduler
        await victim.restart()
        assert victim.port == port
        await wait_until(lambda: _health(rig), lambda s: s == 200, timeout=10.0)

    tally, watch = await drive(rig, mixed_agents(turns=10, max_tokens=160), fault, report)
    await check_invariants(rig, tally, watch)
    assert tally.counts()["completed"] > 0
    # The kill cut work in flight: a relayed stream broke, or an attempt was sent again elsewhere.
    arrivals = Counter(a["id"] for e in rig.engines for a in read_arrivals(e.tap_log))
    assert any("broken off" in r.detail for r in tally.records) or max(arrivals.values()) > 1


async def test_5xx_burst(make_rig: RigFactory, report: Callable[[Tally], None]) -> None:
    """One engine refuses (503, retried elsewhere), the other fails half its requests (500, relayed)."""
    rig, _ = await make_rig()
    refusing, failing = rig.engines

    async def fault(_: Tally) -> None:
        await _arrivals_at_least(rig, 0, 3)
        await rig.fault(refusing, mode="refuse")
        await rig.fault(failing, mode="none", fail_rate=0.5)
        await _arrivals_at_least(rig, None, 30)
        await rig.fault(refusing, mode="none")
        await rig.fault(failing, mode="none", fail_rate=0.0)

    tally, watch = await drive(rig, mixed_agents(), fault, report)
    await check_invariants(rig, tally, watch)
    statuses = {r.status for r in tally.records if r.outcome == "error"}
    assert statuses <= {500, 502, 503, 504}, statuses
    arrivals = Counter(a["id"] for e in rig.engines for a in read_arrivals(e.tap_log))
    assert max(arrivals.values()) > 1  # failed attempts were sent again (before any byte was relayed)


async def test_stall_longer_than_the_request_timeout(
    make_rig: RigFactory, report: Callable[[Tally], None]
) -> None:
    rig, _ = await make_rig(request_timeout_secs=2.0)

    stalled = rig.engines[0]

    async def held() -> int:
        async with rig.session.get(stalled.url + "/server_info") as r:
            return sum(rank["running"] + rank["waiting"] for rank in (await r.json())["ranks"])

    async def fault(_: Tally) -> None:
        await _arrivals_at_least(rig, 0, 3)
        await rig.fault(stalled, mode="stall")
        # The stall must catch a request: with every agent on it between turns it could pass unnoticed
        # (about one run in 300), so it lasts from the first request it holds.
        await wait_until(held, lambda n: n > 0, timeout=15.0)
        await asyncio.sleep(3.0)  # the fault's length, not an assertion: the stall outlasts the timeout
        await rig.fault(stalled, mode="none")

    tally, watch = await drive(rig, mixed_agents(turns=8), fault, report)
    await check_invariants(rig, tally, watch)
    # An attempt outlived the timeout: its client got a 504 or a broken stream, or (no byte relayed yet) it
    # was sent again — 504 is retried, and a Program's retry can wait out the stall on its own Rank.
    arrivals = Counter(a["id"] for e in rig.engines for a in read_arrivals(e.tap_log))
    timed_out = [r for r in tally.records if r.status in (504, 200) and r.outcome == "error"]
    assert timed_out or max(arrivals.values()) > 1


async def test_cut_streams(make_rig: RigFactory, report: Callable[[Tally], None]) -> None:
    rig, _ = await make_rig()

    async def fault(tally: Tally) -> None:
        async def broken() -> int:
            return sum("broken off" in r.detail for r in tally.records)

        await _arrivals_at_least(rig, 0, 3)
        await rig.fault(rig.engines[0], mode="cut_streams")
        await wait_until(broken, lambda n: n >= 1, timeout=15.0)  # a stream was cut after bytes
        await rig.fault(rig.engines[0], mode="none")

    tally, watch = await drive(rig, mixed_agents(turns=8), fault, report)
    await check_invariants(rig, tally, watch)


async def test_metrics_outage_and_recovery(make_rig: RigFactory, report: Callable[[Tally], None]) -> None:
    rig, _ = await make_rig()

    async def sources() -> set[str]:
        return {r["capacity_accounting_source"] for r in (await rig.diagnostics())["ranks"]}

    async def fault(_: Tally) -> None:
        await _arrivals_at_least(rig, 0, 3)
        for engine, mode in zip(rig.engines, ("fail", "hang"), strict=True):
            await rig.engine_post(engine, "/tap/metrics", {"mode": mode})
        await wait_until(lambda: sources(), lambda s: "backend_observation" not in s, timeout=10.0)
        for engine in rig.engines:
            await rig.engine_post(engine, "/tap/metrics", {"mode": "ok"})
        await wait_until(lambda: sources(), lambda s: s == {"backend_observation"}, timeout=10.0)

    tally, watch = await drive(rig, mixed_agents(turns=10), fault, report)
    await check_invariants(rig, tally, watch)
