"""`progrouter simulate` end to end: flags, report files, errors."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import orjson
import pytest

from progrouter.cli import main
from progrouter.engine.profiles import load_profile
from progrouter.workload import trace as trace_mod

from .workloads import small_trace

pytestmark = pytest.mark.timeout(120)

SMALL_FLAGS = [
    "--tasks", "3", "--turns-min", "2", "--turns-max", "4", "--block-size", "16",
    "--system-prompt-tokens", "256", "--task-prompt-tokens", "128", "--tool-result-tokens", "64",
    "--output-tokens", "8", "--output-tokens-max", "16", "--max-context-tokens", "1024",
]  # fmt: skip


def test_generate_runs_every_arm_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "r"
    code = main(
        [
            "simulate", "--generate", "coding", *SMALL_FLAGS, "--ranks", "2", "--num-blocks", "96",
            "--arms", "native,round_robin,program,binding_only,oracle",
            "--program-config", '{"token_capacity_per_dp_rank": "auto", "global_queue": true}',
            "--variant", 'lpc={"binding_strategy": "least_program_count"}',
            "--hint", "next-gap", "--variant-hint", "program=none", "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    report = orjson.loads((out / "report.json").read_bytes())
    assert list(report["arms"]) == ["binding_only", "lpc", "native", "oracle", "program", "round_robin"]
    assert report["program_config"] == {"token_capacity_per_dp_rank": "auto", "global_queue": True}
    specs = report["arm_specs"]
    assert specs["lpc"]["program_config"]["binding_strategy"] == "least_program_count"
    assert specs["lpc"]["kv_retention_hint"] == "next-gap"
    assert specs["program"]["kv_retention_hint"] is None
    assert specs["binding_only"]["program_config"]["binding_only"] is True
    assert specs["oracle"]["unbounded_kv"] is True
    assert report["fleet"]["oracle_num_blocks_per_rank"] > 96
    assert report["comparison"]["native"]["ratios_to_native"]["jct_seconds.mean"] == 1.0
    assert set(report["scheduler"]) == {"binding_only", "lpc", "program"}
    for arm in report["arms"]:
        facts = (out / arm / "facts.jsonl").read_bytes().splitlines()
        assert len(facts) == report["trace"]["requests"]
    ranks = orjson.loads((out / "program" / "diagnostics.json").read_bytes())["ranks"]
    assert [(r["token_capacity"], r["token_capacity_source"]) for r in ranks] == [(96 * 16, "reported")] * 2
    assert (out / "timing.json").exists()


def test_a_trace_file_and_its_block_size(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    trace_mod.save(small_trace().head(2), path)
    out = tmp_path / "r"
    assert (
        main(["simulate", "--trace", str(path), "--num-blocks", "512", "--arms", "native", "--out", str(out)])
        == 0
    )
    report = orjson.loads((out / "report.json").read_bytes())
    assert report["fleet"]["block_size"] == 16  # the trace's
    assert report["trace"]["tasks"] == 2


def test_the_default_program_arm_is_the_recommended_deployment(tmp_path: Path) -> None:
    """Without --program-config the Program arm runs the recommended line: each Rank's reported KV as its
    token capacity ("auto"), the global queue, least_program_count binding and the adaptive acting TTL
    (the spec's defaults are untouched: an explicit config gets exactly what it says, as the first test
    shows)."""
    out = tmp_path / "r"
    flags = ["simulate", "--generate", "coding", *SMALL_FLAGS, "--ranks", "2", "--num-blocks", "96"]
    assert main([*flags, "--arms", "native,program", "--out", str(out)]) == 0
    report = orjson.loads((out / "report.json").read_bytes())
    assert report["program_config"] == {
        "token_capacity_per_dp_rank": "auto",
        "global_queue": True,
        "binding_strategy": "least_program_count",
        "acting_ttl_policy": "adaptive",
    }
    program = report["arm_specs"]["program"]["program_config"]
    assert program["acting_ttl_policy"] == "adaptive"
    assert report["arms"]["program"]["completed_tasks"] == report["trace"]["tasks"]


@pytest.mark.parametrize(
    "flags",
    [
        ["--arms", "native,upstream"],
        ["--arms", "native,bogus"],
        ["--program-config", "[1]"],
        ["--program-config", '{"no_such_knob": 1}'],
        ["--hint", "soon"],
        ["--hint", "next-gap:x"],
        ["--hint", "-1"],
        ["--variant-hint", "nobody=1"],
        ["--variant", "broken"],
    ],
)
def test_bad_flags_are_errors(tmp_path: Path, flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--generate", "coding", *SMALL_FLAGS, *flags, "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "error" in capsys.readouterr().out
    assert not (tmp_path / "report.json").exists()


def test_max_concurrent_tasks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r"
    argv = ["simulate", "--generate", "coding", *SMALL_FLAGS, "--arms", "native", "--num-blocks", "512"]
    assert main([*argv, "--max-concurrent-tasks", "1", "--out", str(out)]) == 0
    report = orjson.loads((out / "report.json").read_bytes())
    assert report["trace"]["max_concurrent_tasks"] == 1
    assert report["arms"]["native"]["completed_tasks"] == 3
    facts = [orjson.loads(line) for line in (out / "native" / "facts.jsonl").read_bytes().splitlines()]
    start = {f["task_id"]: f["task_start"] for f in facts}
    end = {t: max(f["finished_at"] for f in facts if f["task_id"] == t) for t in start}
    ordered = sorted(start, key=start.__getitem__)
    assert len(ordered) == 3
    assert all(end[a] <= start[b] for a, b in pairwise(ordered))  # one at a time
    with pytest.raises(SystemExit):
        main([*argv, "--max-concurrent-tasks", "0", "--out", str(tmp_path / "bad")])
    assert "positive integer" in capsys.readouterr().err


def test_agentic_workload_on_an_engine_profile(tmp_path: Path) -> None:
    """`--generate agentic --engine-profile h200-qwen-32b`: the Ranks get the profile's KV (291,251 tokens in
    blocks of 256) and the Program arm the profile's cost models, under what --program-config sets itself."""
    out = tmp_path / "r"
    code = main(
        [
            "simulate", "--generate", "agentic", "--tasks", "3", "--seed", "2", "--block-size", "256",
            "--max-context-tokens", "60000", "--engine-profile", "h200-qwen-32b", "--ranks", "2",
            "--arms", "native,program",
            "--program-config", '{"decode_throughput_model": {"fixed_step_seconds": 0.5}}',
            "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    report = orjson.loads((out / "report.json").read_bytes())
    profile = load_profile("h200-qwen-32b")
    assert report["fleet"]["num_blocks_per_rank"] == profile.kv_tokens_per_rank // 256
    config = report["program_config"]
    assert config["prefill_cost_model"] == profile.prefill_cost_model.model_dump(mode="json")
    assert config["decode_throughput_model"]["fixed_step_seconds"] == 0.5  # the experiment's own wins
    decode = profile.decode_throughput_model
    assert (
        config["decode_throughput_model"]["context_step_seconds_per_token"]
        == decode.context_step_seconds_per_token
    )
    facts = [orjson.loads(line) for line in (out / "native" / "facts.jsonl").read_bytes().splitlines()]
    assert facts and all(f["status"] == "ok" for f in facts)
    assert max(f["input_tokens"] for f in facts) <= 60000


def test_an_unknown_profile_is_refused(tmp_path: Path) -> None:
    code = main(["simulate", "--generate", "agentic", "--tasks", "1", "--engine-profile", "tpu-9",
                 "--out", str(tmp_path / "r")])  # fmt: skip
    assert code == 2
    assert not (tmp_path / "r").exists()
