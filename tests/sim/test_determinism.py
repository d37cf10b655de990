"""Same inputs, same report: in one process, and across processes with different hash seeds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from progrouter.sim.arms import NEXT_GAP, standard_arm, variant_arm
from progrouter.sim.report import build_report, dump
from progrouter.sim.simulation import Simulation

from .workloads import TIGHT, small_trace

pytestmark = pytest.mark.timeout(120)

CONFIG = {"token_capacity_per_dp_rank": TIGHT.capacity_tokens, "global_queue": True}


def report_bytes() -> bytes:
    trace = small_trace()
    arms = [
        standard_arm("native", CONFIG),
        standard_arm("round_robin", CONFIG),
        standard_arm("program", CONFIG),
        variant_arm("hinted", CONFIG, {"binding_strategy": "least_program_count"}, hint=NEXT_GAP),
    ]
    results = [Simulation(trace, TIGHT, arm).run() for arm in arms]
    return dump(build_report(trace, TIGHT, results, CONFIG))


def test_the_same_inputs_give_a_byte_identical_report() -> None:
    first = report_bytes()
    assert first == report_bytes()
    assert b'"completed_tasks": 6' in first


def test_the_report_does_not_depend_on_the_hash_seed(tmp_path: Path) -> None:
    """String hashing is salted per process: nothing may iterate a set of strings into a decision."""
    argv = [
        sys.executable, "-m", "progrouter", "simulate", "--generate", "coding",
        "--tasks", "4", "--turns-min", "3", "--turns-max", "6", "--block-size", "16",
        "--system-prompt-tokens", "512", "--task-prompt-tokens", "256", "--tool-result-tokens", "128",
        "--output-tokens", "16", "--output-tokens-max", "32", "--max-context-tokens", "1800",
        "--subagent-prob", "0.3", "--ranks", "2", "--num-blocks", "128",
        "--arms", "native,program", "--variant", 'rtb={"binding_strategy": "reasoning_token_balance"}',
    ]  # fmt: skip
    reports = []
    for seed in ("1", "2"):
        out = tmp_path / seed
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([*argv, "--out", str(out)], env=env, capture_output=True, timeout=100)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        reports.append((out / "report.json").read_bytes())
    assert reports[0] == reports[1]
