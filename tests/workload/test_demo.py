"""`progrouter demo` end to end on a tiny run: its verdict line states what its own report measured."""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
import pytest

from progrouter.config import ProgramSchedulingConfig
from progrouter.workload.demo_cli import add_arguments, run
from progrouter.workload.facts import load_facts
from progrouter.workload.report import prefill_gpu_seconds


def test_demo_verdict_states_the_ratio_and_savings_of_its_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--tasks", "2", "--no-upstream", "--time-scale", "40", "--report-dir", str(tmp_path)]
    )
    assert run(args) == 0
    out = capsys.readouterr().out
    arms = orjson.loads((tmp_path / "report.json").read_bytes())["arms"]
    assert set(arms) == {"native", "program", "oracle"}
    jct = arms["program"]["jct_seconds"]["mean"] / arms["native"]["jct_seconds"]["mean"]
    model = ProgramSchedulingConfig().prefill_cost_model
    spent = {a: prefill_gpu_seconds(load_facts(tmp_path / a / "facts.jsonl"), model) for a in arms}
    assert spent["native"] > 0
    verdict = [line for line in out.splitlines() if line.startswith("program: ")]
    assert len(verdict) == 1, out
    assert f"{jct:.2f}x native mean JCT" in verdict[0]
    assert f"{spent['native'] - spent['program']:,.0f} prefill GPU-seconds saved" in verdict[0]
    hit = f"native {100 * arms['native']['token_cache_hit']:.0f}%"
    assert any(line.startswith("token cache hit: ") and hit in line for line in out.splitlines()), out
