"""Report arithmetic on a tiny run whose every figure is known by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from progrouter.workload.facts import Fact
from progrouter.workload.report import ArmInputs, arm_figures, compare, gap_closed, parse_metrics

SCALE = 2.0  # one wall second is two modelled seconds


def fact(
    task: str,
    step: int,
    start: float,
    end: float,
    *,
    task_start: float,
    ttft: float | None = 0.2,
    status: str = "ok",
    headers: float = 0.05,
) -> Fact:
    return Fact(
        request_id=f"{task}:lead:{step}",
        task_id=task,
        program_id=f"{task}:lead",
        agent_id="lead",
        agent_role="lead",
        parent_program_id=None,
        step_id=step,
        task_start=task_start,
        ready_at=start,
        started_at=start,
        finished_at=end,
        input_tokens=100,
        planned_output_tokens=10,
        time_scale=SCALE,
        headers_at=start + headers,
        first_token_at=None if ttft is None else start + ttft,
        prompt_tokens=100,
        output_tokens=10,
        cached_tokens=40,
        status=status,
    )


FACTS = [
    fact("A", 0, 0.0, 1.0, task_start=0.0, ttft=0.5),
    fact("A", 1, 1.5, 2.0, task_start=0.0, ttft=0.2),
    fact("B", 0, 0.5, 1.5, task_start=0.5, ttft=0.2),
    fact("B", 1, 2.0, 2.5, task_start=0.5, status="error", ttft=None),
    fact("C", 0, 1.0, 4.0, task_start=1.0, ttft=0.4),
]
PLANNED = {"A": 2, "B": 2, "C": 1}

ENGINE_BEFORE = """# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 100
vllm:prompt_tokens_total{engine="1",model_name="m"} 0
# TYPE vllm:prompt_tokens_cached counter
vllm:prompt_tokens_cached_total{engine="0",model_name="m"} 50
vllm:prompt_tokens_cached_total{engine="1",model_name="m"} 0
"""
ENGINE_AFTER = """# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1100
vllm:prompt_tokens_total{engine="1",model_name="m"} 1000
# TYPE vllm:prompt_tokens_cached counter
vllm:prompt_tokens_cached_total{engine="0",model_name="m"} 850
vllm:prompt_tokens_cached_total{engine="1",model_name="m"} 250
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3
vllm:request_success_total{engine="1",finished_reason="length",model_name="m"} 1
vllm:request_success_total{engine="1",finished_reason="abort",model_name="m"} 1
"""
ROUTER = """# TYPE vllm_router_agent_aware_queue_wait_seconds histogram
vllm_router_agent_aware_queue_wait_seconds_bucket{target="a",le="0.1"} 1
vllm_router_agent_aware_queue_wait_seconds_bucket{target="a",le="0.5"} 1
vllm_router_agent_aware_queue_wait_seconds_bucket{target="a",le="1.0"} 2
vllm_router_agent_aware_queue_wait_seconds_bucket{target="a",le="+Inf"} 2
vllm_router_agent_aware_queue_wait_seconds_count{target="a"} 2
vllm_router_agent_aware_queue_wait_seconds_sum{target="a"} 0.9
vllm_router_agent_aware_queue_wait_seconds_bucket{target="b",le="0.1"} 1
vllm_router_agent_aware_queue_wait_seconds_bucket{target="b",le="0.5"} 2
vllm_router_agent_aware_queue_wait_seconds_bucket{target="b",le="1.0"} 2
vllm_router_agent_aware_queue_wait_seconds_bucket{target="b",le="+Inf"} 2
vllm_router_agent_aware_queue_wait_seconds_count{target="b"} 2
vllm_router_agent_aware_queue_wait_seconds_sum{target="b"} 0.3
# TYPE vllm_router_agent_aware_transitions counter
vllm_router_agent_aware_transitions_total{target="a",reason="cross_rank_resume"} 1
vllm_router_agent_aware_transitions_total{target="b",reason="cross_rank_resume"} 1
vllm_router_agent_aware_transitions_total{target="b",reason="force_resume"} 1
"""


def figures(router: str = ROUTER) -> dict[str, object]:
    return arm_figures(
        ArmInputs(
            facts=FACTS,
            planned_requests=PLANNED,
            engine_before=parse_metrics(ENGINE_BEFORE, "http://e"),
            engine_after=parse_metrics(ENGINE_AFTER, "http://e"),
            router_after=parse_metrics(router),
        )
    )


def test_jct_latency_throughput_and_counts() -> None:
    f = figures()
    # A: (2.0 - 0.0) * 2 = 4; C: (4.0 - 1.0) * 2 = 6; B has an error: not completed.
    assert f["completed_tasks"] == 2 and f["tasks"] == 3
    assert f["jct_seconds"] == pytest.approx({"mean": 5.0, "p50": 5.0, "p90": 5.8})
    # TTFT of ok requests: 0.5, 0.2, 0.2, 0.4 wall → 1.0, 0.4, 0.4, 0.8 modelled.
    assert f["ttft_seconds"]["p50"] == pytest.approx(0.6)  # type: ignore[index]
    assert f["makespan_seconds"] == pytest.approx(8.0)
    assert f["requests_per_second"] == pytest.approx(0.5)
    assert f["output_tokens_per_second"] == pytest.approx(5.0)
    assert (f["requests"], f["ok_requests"], f["errors"]) == (5, 4, 1)
    assert (f["input_tokens"], f["output_tokens"]) == (400, 40)


def test_cache_hit_from_engine_counter_deltas_and_per_rank() -> None:
    f = figures()
    assert f["token_cache_hit"] == pytest.approx(1050 / 2000)
    assert f["usage_cache_hit"] == pytest.approx(0.4)
    assert f["ranks"] == [
        {"rank": "http://e@0", "requests": 3.0, "prompt_tokens": 1000.0, "token_cache_hit": 0.8},
        {"rank": "http://e@1", "requests": 2.0, "prompt_tokens": 1000.0, "token_cache_hit": 0.25},
    ]


def test_queue_wait_from_router_histogram_else_replay() -> None:
    q = figures()["queue_wait"]
    assert q["source"] == "router histogram"  # type: ignore[index]
    # summed buckets: ≤0.1: 2, ≤0.5: 3, ≤1: 4 of 4; sum 1.2 wall → mean 0.3 wall = 0.6 modelled
    assert q["mean"] == pytest.approx(0.6)  # type: ignore[index]
    assert q["p50"] == pytest.approx(0.2)  # type: ignore[index]  # 0.1 wall
    assert q["p90"] == pytest.approx(1.6)  # type: ignore[index]  # 0.5 + 0.5 * 0.6 wall
    replay_side = figures(router="")["queue_wait"]
    assert replay_side["source"].startswith("replay")  # type: ignore[index]
    assert replay_side["p50"] == pytest.approx(0.1)  # type: ignore[index]  # 0.05 wall to headers


def test_transitions() -> None:
    t = figures()["transitions"]
    assert t["cross_rank_resume"] == 2 and t["force_resume"] == 1 and t["max_segment_yield"] == 0  # type: ignore[index]


def test_ratios_and_gap_closed() -> None:
    arms = {
        "native": {"jct_seconds": {"mean": 10.0}, "token_cache_hit": 0.5},
        "program": {"jct_seconds": {"mean": 8.0}, "token_cache_hit": 0.75},
        "oracle": {"jct_seconds": {"mean": 6.0}, "token_cache_hit": 1.0},
    }
    c = compare(arms)
    assert c["program"]["ratios_to_native"]["jct_seconds.mean"] == pytest.approx(0.8)
    assert c["program"]["ratios_to_native"]["token_cache_hit"] == pytest.approx(1.5)
    assert c["program"]["jct_gap_closed"] == pytest.approx(0.5)
    assert c["oracle"]["jct_gap_closed"] == pytest.approx(1.0)
    assert c["native"]["jct_gap_closed"] == pytest.approx(0.0)
    assert (
        gap_closed({"native": arms["native"], "program": arms["program"]}, "program", "native", "oracle")
        is None
    )


def test_table_and_plots(tmp_path: Path) -> None:
    from rich.console import Console

    from progrouter.workload.render import plot, print_report

    native = figures()
    native["jct_per_task"] = {"A": 4.0, "C": 6.0}
    arms = {"native": native, "program": dict(native, token_cache_hit=0.75)}
    report = {"arms": arms, "comparison": compare(arms), "program_config": {"global_queue": True}}
    console = Console(record=True, width=200)
    print_report(report, console, tmp_path)
    text = console.export_text()
    assert "75.0% (1.43×)" in text and "router histogram" in text and "engine 0 Rank 1" in text
    paths = plot(report, tmp_path)
    assert [p.name for p in paths] == ["jct.png", "cache_hit.png", "queue_wait.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_queue_wait_from_a_summary() -> None:
    summary = """# TYPE vllm_router_agent_aware_queue_wait_seconds summary
vllm_router_agent_aware_queue_wait_seconds{target="a",quantile="0.5"} 0.1
vllm_router_agent_aware_queue_wait_seconds{target="a",quantile="0.9"} 0.3
vllm_router_agent_aware_queue_wait_seconds_sum{target="a"} 0.6
vllm_router_agent_aware_queue_wait_seconds_count{target="a"} 3
vllm_router_agent_aware_queue_wait_seconds{target="b",quantile="0.5"} 0.5
vllm_router_agent_aware_queue_wait_seconds{target="b",quantile="0.9"} 0.7
vllm_router_agent_aware_queue_wait_seconds_sum{target="b"} 0.4
vllm_router_agent_aware_queue_wait_seconds_count{target="b"} 1
"""
    q = figures(router=summary)["queue_wait"]
    assert q["source"] == "router summary"  # type: ignore[index]
    assert q["mean"] == pytest.approx(2 * 1.0 / 4)  # type: ignore[index]  # (0.6 + 0.4) / 4 wall, × 2
    assert q["p50"] == pytest.approx(2 * (3 * 0.1 + 0.5) / 4)  # type: ignore[index]
    assert q["p90"] == pytest.approx(2 * (3 * 0.3 + 0.7) / 4)  # type: ignore[index]
