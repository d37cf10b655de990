"""`progrouter bench --engine-profile`: its emulators run the profile and its Program arms model it."""

from __future__ import annotations

import argparse

import pytest

from progrouter.config import ConfigError
from progrouter.engine.profiles import load_profile
from progrouter.workload.arms import EngineFleet
from progrouter.workload.bench_cli import add_arguments, plan_from_args
from progrouter.workload.trace_cli import trace_from_args


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--tasks", "2", "--arms", "native,program", *flags])


def test_profile_sets_the_engines_and_the_router_costs() -> None:
    args = parse("--engine-profile", "h200-qwen-32b", "--engine-block-size", "64")
    plan = plan_from_args(args, trace_from_args("coding", args))
    profile = load_profile("h200-qwen-32b")
    assert isinstance(plan.fleet, EngineFleet)
    assert plan.fleet.num_blocks == profile.kv_tokens_per_rank // 64
    argv = plan.fleet.argv(8000, plan.fleet.num_blocks)
    assert argv[argv.index("--engine-profile") + 1] == "h200-qwen-32b"
    assert plan.program_config["token_capacity_per_dp_rank"] == "auto"  # each emulator reports its KV
    assert plan.program_config["prefill_cost_model"] == profile.prefill_cost_model.model_dump(mode="json")


def test_explicit_blocks_win_and_no_profile_changes_nothing() -> None:
    args = parse("--engine-profile", "h200-llama-8b", "--num-blocks", "2048")
    assert plan_from_args(args, trace_from_args("coding", args)).fleet.num_blocks == 2048
    args = parse()
    plan = plan_from_args(args, trace_from_args("coding", args))
    assert plan.fleet.num_blocks == EngineFleet().num_blocks
    assert "--engine-profile" not in plan.fleet.argv(8000, 1)
    assert "prefill_cost_model" not in plan.program_config


def test_unknown_profile_is_an_error() -> None:
    args = parse("--engine-profile", "nope")
    with pytest.raises((ConfigError, ValueError), match="unknown engine profile"):
        plan_from_args(args, trace_from_args("coding", args))
