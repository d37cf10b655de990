"""Clients that go away: while their request is pooled, in the middle of a stream, and between turns.

Room for one Program per Rank, nine Program agents: most requests wait in the RequestPool, so the
"pooled" hang-ups land there. An agent that leaves between turns never comes back, its Program still
Active: its capacity must come back through the acting TTL, not stay charged.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from support.agents import AgentPlan, Disconnect, Tally

from .conftest import RigFactory
from .harness import check_invariants, drive, mixed_agents

pytestmark = pytest.mark.timeout(90)


async def _nothing(_: Tally) -> None:
    return None


async def test_clients_disconnect_while_pooled_streaming_and_between_turns(
    make_rig: RigFactory, report: Callable[[Tally], None]
) -> None:
    rig, _ = await make_rig(program={"token_capacity_per_dp_rank": 450})
    plans = mixed_agents(programs=2, native=2, turns=6)
    modes: list[Disconnect] = ["streaming", "streaming", "between_turns", "between_turns"]
    modes += ["pooled", "pooled", "pooled"]
    plans += [
        # the pooled ones arrive last, when the others hold the capacity
        AgentPlan(f"d{i}-{mode}", max_tokens=48, disconnect=mode, start_seconds=0.2 * (mode == "pooled"))
        for i, mode in enumerate(modes)
    ]
    tally, watch = await drive(rig, plans, _nothing, report)
    await check_invariants(rig, tally, watch)
    assert watch.queued_seen > 0  # Programs did wait in the pool
    aborted = [r.detail for r in tally.records if r.outcome == "aborted"]
    assert any("mid-stream" in d for d in aborted), aborted
    outcomes = [(r.outcome, r.status, r.elapsed) for r in tally.records]
    assert any("while waiting" in d for d in aborted), outcomes
