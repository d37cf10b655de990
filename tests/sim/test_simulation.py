"""The simulator on traces whose every figure is known by hand."""

from __future__ import annotations

import pytest

from progrouter.config import DecodeThroughputModel, PrefillCostModel
from progrouter.sim.arms import NEXT_GAP, NEXT_GAP_SLACK, parse_hint, standard_arm, variant_arm
from progrouter.sim.ranks import FleetSpec
from progrouter.sim.simulation import ArmResult, Simulation
from progrouter.workload.facts import Fact
from progrouter.workload.trace import Trace, TraceTask

from .traces import BS, lead, req, sub, trace

pytestmark = pytest.mark.timeout(60)

ONE_RANK = FleetSpec(ranks=1, num_blocks=256, block_size=BS)


def run(t: Trace, arm: str = "native", fleet: FleetSpec = ONE_RANK, **config: object) -> ArmResult:
    return Simulation(t, fleet, standard_arm(arm, dict(config))).run()


def by_id(result: ArmResult) -> dict[str, Fact]:
    return {f.request_id: f for f in result.facts}


def decode_seconds(prompt: int, outputs: int) -> float:
    """A lone request's decode steps after its first token: step k attends to prompt + k tokens."""
    model = DecodeThroughputModel()
    return sum(model.step_seconds(1, prompt + k) for k in range(1, outputs))


@pytest.mark.parametrize("arm", ["native", "round_robin", "program", "binding_only", "oracle"])
def test_second_turn_hits_the_shared_whole_blocks(arm: str) -> None:
    # Turn 2 repeats turn 1's 4 blocks and adds 2: 64 of its 96 prompt tokens come from the prefix cache.
    t = trace(TraceTask("t", 0.0, (lead("t", req([0, 1, 2, 3]), req([0, 1, 2, 3, 4, 5], gap=1.5)),)))
    facts = by_id(run(t, arm))
    first, second = facts["t:lead:0"], facts["t:lead:1"]
    assert (first.prompt_tokens, first.cached_tokens, first.output_tokens) == (64, 0, 8)
    assert (second.prompt_tokens, second.cached_tokens, second.output_tokens) == (96, 64, 8)
    # A lone cold prefill's TTFT is the cost model's prefill time; then one decode step per token.
    ttft = PrefillCostModel().prefill_seconds(64)
    assert first.first_token_at == pytest.approx(ttft)
    assert first.finished_at == pytest.approx(ttft + decode_seconds(64, 8))
    # Closed loop: the second turn leaves exactly one gap after the first completed.
    assert second.started_at == pytest.approx(first.finished_at + 1.5)
    assert second.ttft == pytest.approx(PrefillCostModel().prefill_seconds(32))


def test_report_figures_come_from_the_live_arithmetic() -> None:
    t = trace(TraceTask("t", 0.0, (lead("t", req([0, 1, 2, 3]), req([0, 1, 2, 3, 4, 5], gap=1.5)),)))
    result = run(t)
    figures = result.figures
    facts = by_id(result)
    assert figures["token_cache_hit"] == pytest.approx(64 / (64 + 96))
    assert figures["engine_prompt_tokens"] == 160
    assert figures["jct_seconds"]["mean"] == pytest.approx(facts["t:lead:1"].finished_at)
    assert figures["ranks"] == [
        {"rank": "http://sim@0", "requests": 2.0, "prompt_tokens": 160.0, "token_cache_hit": 0.4}
    ]


def blocking_task(blocks: bool) -> TraceTask:
    parent = lead("t", req([0, 1]), req([0, 1, 2], gap=0.5))
    child = sub("t", "sub", req([0, 1, 9], gap=0.1), req([0, 1, 9, 10], gap=2.0), blocks=blocks, after=0)
    return TraceTask("t", 0.0, (parent, child))


@pytest.mark.parametrize("arm", ["native", "program"])
def test_a_blocking_subagent_delays_its_parent(arm: str) -> None:
    facts = by_id(run(trace(blocking_task(True)), arm))
    lead0, lead1 = facts["t:lead:0"], facts["t:lead:1"]
    sub0, sub1 = facts["t:sub:0"], facts["t:sub:1"]
    assert sub0.started_at == pytest.approx(lead0.finished_at + 0.1)  # spawned when lead:0 completed
    assert sub1.started_at == pytest.approx(sub0.finished_at + 2.0)
    assert lead1.started_at == sub1.finished_at > lead0.finished_at + 0.5  # waited for the subagent


def test_a_non_blocking_subagent_runs_beside_its_parent() -> None:
    result = run(trace(blocking_task(False)))
    facts = by_id(result)
    lead0, lead1, sub1 = facts["t:lead:0"], facts["t:lead:1"], facts["t:sub:1"]
    assert lead1.started_at == pytest.approx(lead0.finished_at + 0.5)
    assert lead1.finished_at < sub1.started_at
    # The task ends when its last Program does.
    assert result.figures["jct_seconds"]["mean"] == pytest.approx(sub1.finished_at)


def three_programs() -> Trace:
    """Three one-Program tasks of 64 blocks (1,024 tokens) each, two turns apiece."""
    return trace(
        *(
            TraceTask(f"t{i}", 0.0, (lead(f"t{i}", req(list(range(64))), req(list(range(66)), gap=0.5)),))
            for i in range(3)
        )
    )


def test_the_program_arm_retains_a_third_program_when_capacity_fits_two() -> None:
    # Each Program needs 1,024 context + 100 decode-buffer tokens: 2,500 fit two, not three.
    result = run(three_programs(), "program", token_capacity_per_dp_rank=2500)
    facts = by_id(result)
    first_done = min(facts["t0:lead:0"].finished_at, facts["t1:lead:0"].finished_at)
    assert facts["t0:lead:0"].headers_at == facts["t1:lead:0"].headers_at == 0.0
    third = facts["t2:lead:0"]
    assert third.started_at == 0.0
    assert third.headers_at == pytest.approx(first_done)  # admitted when the first Program paused
    assert result.figures["queue_wait"]["p99"] == pytest.approx(first_done, rel=0.05)
    assert result.scheduler is not None
    assert result.scheduler["queue_wait_seconds"]["max"] == pytest.approx(first_done)
    # Native routing sends all three at once.
    native = by_id(run(three_programs()))
    assert all(f.headers_at == f.started_at for f in native.values())


def test_a_full_request_pool_answers_429_and_the_agent_goes_on() -> None:
    # Capacity for one Program, a pool of one waiting request: the third Program's request is refused.
    result = run(three_programs(), "program", token_capacity_per_dp_rank=1200, max_pooled_requests=1)
    facts = by_id(result)
    refused = [f for f in facts.values() if f.status_code == 429]
    assert [f.request_id for f in refused] == ["t2:lead:0"]
    assert refused[0].error is not None and "pool is full" in refused[0].error
    assert facts["t2:lead:1"].status == "ok"  # its agent sent the next turn after the refusal


def test_a_next_gap_hint_arms_the_hinted_ttl() -> None:
    t = trace(
        TraceTask("t", 0.0, (lead("t", req([0, 1]), req([0, 1, 2], gap=0.75), req([0, 1, 2, 3], gap=3.0)),))
    )
    result = Simulation(t, ONE_RANK, variant_arm("hinted", {}, {}, hint=NEXT_GAP)).run()
    assert result.scheduler is not None
    armed = result.scheduler["armed_ttl_seconds"]
    assert armed["by_source"]["request_hint"]["count"] == 3
    assert armed["mean"] == pytest.approx((0.75 + 3.0 + 2 * NEXT_GAP_SLACK) / 3)
    # Held across both tool calls: one admission, no TTL expiry before the last request's 0-second hint.
    assert result.scheduler["transitions"]["program_admit"] == 1
    # Retaining only tool calls of at most a second: the 3-second gap gets 0 and a second admission.
    short = Simulation(t, ONE_RANK, variant_arm("short", {}, {}, hint=f"{NEXT_GAP}:1")).run()
    assert short.scheduler is not None
    assert short.scheduler["armed_ttl_seconds"]["mean"] == pytest.approx((0.75 + NEXT_GAP_SLACK) / 3)
    assert short.scheduler["transitions"]["program_admit"] == 2


def test_a_short_hint_knows_only_whether_the_tool_call_is_short() -> None:
    t = trace(
        TraceTask("t", 0.0, (lead("t", req([0, 1]), req([0, 1, 2], gap=0.75), req([0, 1, 2, 3], gap=3.0)),))
    )
    result = Simulation(t, ONE_RANK, variant_arm("short", {}, {}, hint="short:1")).run()
    assert result.scheduler is not None
    # The 0.75 s tool call is held for the whole second, the 3 s one not at all, the last request gets 0.
    assert result.scheduler["armed_ttl_seconds"]["mean"] == pytest.approx((1.0 + NEXT_GAP_SLACK) / 3)
    assert result.scheduler["transitions"]["program_admit"] == 2
    with pytest.raises(ValueError, match="short:MAX"):
        parse_hint("short")
