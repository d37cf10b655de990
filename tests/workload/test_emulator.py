"""Replay and bench against the real engine emulator and router (subprocesses on loopback)."""

from __future__ import annotations

import itertools
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from rich.console import Console

from progrouter.workload.arms import EngineFleet
from progrouter.workload.bench import Bench, BenchPlan, scaled_program_config
from progrouter.workload.procs import Child, free_port
from progrouter.workload.replay import ReplayOptions, replay

from .traces import tree_trace

pytestmark = pytest.mark.timeout(180)
TIME_SCALE = 20.0
EPS = 2e-3


@pytest.fixture
async def emulator(tmp_path: Path) -> AsyncIterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "progrouter", "engine", "--port", str(port), "--data-parallel-size", "2",
            "--num-blocks", "512", "--max-model-len", "2048", "--time-scale", str(TIME_SCALE),
            "--log-level", "warning"]  # fmt: skip
    child = await Child.start("engine", argv, tmp_path / "engine.log")
    url = f"http://127.0.0.1:{port}"
    try:
        await child.wait_healthy(f"{url}/health")
        yield url
    finally:
        await child.stop()


async def test_closed_loop_against_the_emulator(emulator: str) -> None:
    trace = tree_trace(2)
    result = await replay(trace, ReplayOptions(url=emulator, time_scale=TIME_SCALE))
    assert not result.interrupted and all(f.ok for f in result.facts)
    by_program = {
        pid: sorted(fs, key=lambda f: f.step_id)
        for pid, fs in itertools.groupby(
            sorted(result.facts, key=lambda f: f.program_id), lambda f: f.program_id
        )
    }
    for task in trace.tasks:
        for p in task.programs:
            facts = by_program[p.program_id]
            assert [f.step_id for f in facts] == list(range(len(p.requests)))
            for prev, cur, r in zip(facts, facts[1:], p.requests[1:], strict=False):
                assert cur.started_at >= prev.finished_at + r.gap / TIME_SCALE - EPS
        lead, sub_b = by_program[f"{task.task_id}:lead"], by_program[f"{task.task_id}:sub-b"]
        assert sub_b[0].started_at >= lead[0].finished_at - EPS
        assert lead[1].started_at >= sub_b[-1].finished_at - EPS  # the blocking subagent held the lead
        assert lead[1].prompt_tokens == 64 and lead[1].output_tokens == 3
    # Every prompt starts with the two shared blocks; 12 requests on 2 Ranks must hit the prefix cache.
    assert sum(f.cached_tokens or 0 for f in result.facts) >= 32


def test_router_config_is_time_scaled() -> None:
    cfg = scaled_program_config({"global_queue": True, "token_capacity_per_dp_rank": 1000}, 10.0)
    assert cfg["global_queue"] is True and cfg["token_capacity_per_dp_rank"] == 1000
    assert cfg["metrics_interval_seconds"] == pytest.approx(0.1)
    assert cfg["max_acting_ttl_seconds"] == pytest.approx(1.0)
    # the weighed and adaptive TTLs' longest hold and check, and the hints' cap (the replay scales hints)
    assert cfg["max_kv_retention_ttl_seconds"] == pytest.approx(6.0)
    assert cfg["weighed_ttl_check_seconds"] == pytest.approx(0.5)
    assert cfg["weighed_ttl_max_seconds"] == pytest.approx(12.0)
    assert cfg["prefill_cost_model"]["intercept_seconds"] == pytest.approx(0.06600061907132926 / 10)
    assert cfg["prefill_cost_model"]["decode_throughput_alpha"] == 0.15  # a ratio, not a time
    assert cfg["decode_throughput_model"]["fixed_step_seconds"] == pytest.approx(0.010635218423115973 / 10)


async def test_bench_two_arms_end_to_end(tmp_path: Path) -> None:
    fleet = EngineFleet(engines=1, dp_size=2, num_blocks=512, max_model_len=2048, time_scale=TIME_SCALE)
    plan = BenchPlan(
        trace=tree_trace(3),
        arms=("native", "program"),
        fleet=fleet,
        program_config={"global_queue": True, "token_capacity_per_dp_rank": fleet.capacity_tokens},
        report_dir=tmp_path / "report",
        replay=ReplayOptions(url=""),
    )
    report = await Bench(plan, Console(quiet=True)).run()
    native, program = report["arms"]["native"], report["arms"]["program"]
    for figs in (native, program):
        assert figs["completed_tasks"] == 3 and figs["errors"] == 0
        assert figs["engine_prompt_tokens"] == sum(
            r.input_tokens for _t, p in plan.trace.programs() for r in p.requests
        )
        assert sum(r["requests"] for r in figs["ranks"]) == plan.trace.num_requests
        assert 0.0 < figs["token_cache_hit"] < 1.0
    assert program["router_metrics_scraped"]
    saved = orjson.loads((tmp_path / "report" / "report.json").read_bytes())
    assert set(saved["arms"]) == {"native", "program"}
    assert (tmp_path / "report" / "program" / "facts.jsonl").exists()
    assert (tmp_path / "report" / "program" / "diagnostics.json").exists()
