"""``max_concurrent_tasks``: the replay's FIFO task slots, event by event on the virtual clock."""

from __future__ import annotations

import pytest

from progrouter.sim.arms import standard_arm, variant_arm
from progrouter.sim.report import build_report, dump
from progrouter.sim.simulation import ArmResult, Simulation
from progrouter.workload.facts import Fact
from progrouter.workload.trace import Trace, TraceTask

from .test_simulation import ONE_RANK
from .traces import lead, req, sub, trace
from .workloads import TIGHT, small_trace

pytestmark = pytest.mark.timeout(120)


def run(t: Trace, limit: int | None, arm: str = "native") -> ArmResult:
    return Simulation(t, ONE_RANK, standard_arm(arm, {}), max_concurrent_tasks=limit).run()


def by_id(result: ArmResult) -> dict[str, Fact]:
    return {f.request_id: f for f in result.facts}


def two_tasks() -> Trace:
    """Task a (with a non-blocking subagent that outlives its lead) and task b, both ready at 0."""
    a = TraceTask(
        "a",
        0.0,
        (
            lead("a", req([0, 1]), req([0, 1, 2], gap=0.5)),
            sub("a", "sub", req([5, 6], gap=0.1), req([5, 6, 7], gap=3.0), blocks=False, after=0),
        ),
    )
    b = TraceTask("b", 0.0, (lead("b", req([10, 11]), req([10, 11, 12], gap=0.5)),))
    return trace(a, b)


@pytest.mark.parametrize("arm", ["native", "program"])
def test_one_slot_runs_two_tasks_back_to_back(arm: str) -> None:
    result = run(two_tasks(), 1, arm)
    facts = by_id(result)
    a_end = max(f.finished_at for f in facts.values() if f.task_id == "a")
    assert a_end == facts["a:sub:1"].finished_at > facts["a:lead:1"].finished_at  # the subagent ends last
    b0 = facts["b:lead:0"]
    # b starts the instant a's last request completes (not when a's lead does), and its JCT counts from there.
    assert b0.task_start == b0.started_at == a_end
    assert all(f.task_start == 0.0 for f in facts.values() if f.task_id == "a")
    jct = result.figures["jct_per_task"]
    assert jct["b"] == pytest.approx(facts["b:lead:1"].finished_at - a_end)
    assert jct["a"] == pytest.approx(a_end)
    assert max(f.started_at for f in facts.values() if f.task_id == "a") < b0.started_at


def test_without_a_limit_both_tasks_start_at_once() -> None:
    for limit in (None, 2):
        facts = by_id(run(two_tasks(), limit))
        assert facts["a:lead:0"].started_at == facts["b:lead:0"].started_at == 0.0
        assert facts["b:lead:0"].task_start == 0.0


def test_slots_go_in_order_of_arrival_then_trace_order() -> None:
    # c is first in the trace but arrives last; a and b tie at 0 and go in trace order.
    c = TraceTask("c", 0.1, (lead("c", req([20, 21])),))
    a = TraceTask("a", 0.0, (lead("a", req([0, 1]), req([0, 1, 2], gap=0.5)),))
    b = TraceTask("b", 0.0, (lead("b", req([10, 11]), req([10, 11, 12], gap=0.5)),))
    facts = by_id(run(trace(c, a, b), 1))
    assert facts["a:lead:0"].started_at == 0.0
    assert facts["b:lead:0"].task_start == facts["a:lead:1"].finished_at
    assert facts["c:lead:0"].task_start == facts["b:lead:1"].finished_at
    # A task that arrives after a slot freed starts at its own start, not earlier.
    late = TraceTask("late", 60.0, (lead("late", req([30, 31])),))
    facts = by_id(run(trace(a, late), 1))
    assert facts["late:lead:0"].task_start == 60.0


def test_a_limit_is_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        run(two_tasks(), 0)


def limited_report() -> bytes:
    t = small_trace()
    config = {"token_capacity_per_dp_rank": TIGHT.capacity_tokens, "global_queue": True}
    arms = [standard_arm("native", config), standard_arm("program", config)]
    results = [Simulation(t, TIGHT, arm, max_concurrent_tasks=2).run() for arm in arms]
    return dump(build_report(t, TIGHT, results, config, max_concurrent_tasks=2))


def test_a_limited_run_is_deterministic() -> None:
    first = limited_report()
    assert first == limited_report()
    assert b'"max_concurrent_tasks": 2' in first
    assert b'"completed_tasks": 6' in first


@pytest.mark.parametrize("limit", [1, 2])
def test_the_ledger_is_zero_at_the_end_with_a_limit(limit: int) -> None:
    t = small_trace()
    config = {"token_capacity_per_dp_rank": TIGHT.capacity_tokens, "global_queue": True}
    result = Simulation(t, TIGHT, variant_arm("lpc", config, {"binding_strategy": "least_program_count"}),
                        max_concurrent_tasks=limit).run()  # fmt: skip
    assert result.scheduler is not None and result.diagnostics is not None
    end = result.scheduler["end"]
    assert (end["ledger_tokens"], end["active_programs"], end["retained_requests"]) == (0, 0, 0)
    assert all(r["router_in_flight_requests"] == 0 for r in result.diagnostics["ranks"])
    assert result.figures["completed_tasks"] == len(t.tasks)
    # Never more than `limit` tasks between their actual start and their last request's end.
    spans: dict[str, tuple[float, float]] = {}
    for f in result.facts:
        lo, hi = spans.get(f.task_id, (f.task_start, f.finished_at))
        spans[f.task_id] = (min(lo, f.task_start), max(hi, f.finished_at))
    for task_id, (start, _) in spans.items():
        overlapping = [t for t, (s, e) in spans.items() if s <= start < e]
        assert len(overlapping) <= limit, task_id
    if limit == 1:
        assert len({s for s, _ in spans.values()}) == len(t.tasks)
