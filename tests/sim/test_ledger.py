"""Every Program-arm run ends with the scheduler holding nothing: no ledger tokens, no Active Program, no
retained or in-flight request — whatever the config, under KV pressure, with subagents."""

from __future__ import annotations

from typing import Any

import pytest

from progrouter.sim.arms import NEXT_GAP, Hint, variant_arm
from progrouter.sim.simulation import Simulation

from .workloads import TIGHT, small_trace

pytestmark = pytest.mark.timeout(120)

CAPACITY = {"token_capacity_per_dp_rank": TIGHT.capacity_tokens}
CASES: dict[str, tuple[dict[str, Any], Hint]] = {
    "defaults": ({}, None),
    "capacity": (CAPACITY, None),
    "global_queue": ({**CAPACITY, "global_queue": True}, None),
    "binding_only": ({**CAPACITY, "binding_only": True}, None),
    "program_round_robin": ({**CAPACITY, "binding_strategy": "program_round_robin"}, None),
    "least_program_count": ({**CAPACITY, "binding_strategy": "least_program_count"}, None),
    "reasoning_token_balance": ({**CAPACITY, "binding_strategy": "reasoning_token_balance"}, None),
    "hint_next_gap": ({**CAPACITY, "global_queue": True}, NEXT_GAP),
    "hint_long": ({**CAPACITY, "global_queue": True}, 5.0),
    "short_queue_timeout": (
        {**CAPACITY, "queue_timeout_seconds": 0.5, "force_resume_timeout_seconds": 0.2},
        None,
    ),
    "watermarks_and_yields": (
        {**CAPACITY, "high_watermark_ratio": 0.8, "low_watermark_ratio": 0.6, "max_segment_rounds": 2},
        3.0,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_ledger_is_zero_at_the_end(case: str) -> None:
    overrides, hint = CASES[case]
    trace = small_trace()
    result = Simulation(trace, TIGHT, variant_arm(case, {}, overrides, hint=hint)).run()
    assert result.scheduler is not None and result.diagnostics is not None
    end = result.scheduler["end"]
    assert (end["ledger_tokens"], end["active_programs"], end["retained_requests"]) == (0, 0, 0)
    assert end["settled_at"] is not None
    assert all(r["router_in_flight_requests"] == 0 for r in result.diagnostics["ranks"])
    # Every request of the trace ended exactly once, answered or timed out.
    assert len(result.facts) == trace.num_requests
    assert len({f.request_id for f in result.facts}) == trace.num_requests
    timed_out = [f for f in result.facts if f.status_code == 429]
    assert all(f.status == "ok" for f in result.facts if f.status_code != 429)
    if case != "short_queue_timeout":
        assert not timed_out
    assert result.figures["completed_tasks"] == len(trace.tasks) or timed_out
