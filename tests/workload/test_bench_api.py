"""`progrouter bench --api`: the harness shapes run the Program arms with enable key auto; flags that do not
go together are refused before anything starts."""

from __future__ import annotations

import argparse
import json

import pytest
from rich.console import Console

from progrouter.workload.arms import ARMS
from progrouter.workload.bench import Bench
from progrouter.workload.bench_cli import add_arguments, plan_from_args
from progrouter.workload.replay_cli import add_arguments as add_replay_arguments
from progrouter.workload.replay_cli import run as run_replay
from progrouter.workload.trace_cli import trace_from_args


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--tasks", "2", "--arms", "native,program", *flags])


def router_config(*flags: str) -> dict[str, object] | None:
    args = parse(*flags)
    bench = Bench(plan_from_args(args, trace_from_args("coding", args)), Console(quiet=True))
    argv = bench._router_argv(ARMS["program"], ["http://127.0.0.1:1"], 2, 3)
    if "--program-scheduling-config-json" not in argv:
        return None
    config: dict[str, object] = json.loads(argv[argv.index("--program-scheduling-config-json") + 1])
    return config


@pytest.mark.parametrize("api", ["messages", "responses", "chat-session"])
def test_harness_apis_run_the_program_arms_with_enable_key_auto(api: str) -> None:
    config = router_config("--api", api)
    assert config is not None and config["program_scheduling_enable_key"] == "auto"


def test_body_identity_apis_keep_the_default_key_and_an_explicit_key_wins() -> None:
    config = router_config("--api", "chat")
    assert config is not None and config["program_scheduling_enable_key"] == "vllm_xargs.agentic_context"
    explicit = '{"enable_key": "vllm_xargs.agentic_context"}'
    config = router_config("--api", "messages", "--program-config-json", explicit)
    assert config is not None and config["program_scheduling_enable_key"] == "vllm_xargs.agentic_context"


def test_a_kv_retention_hint_with_a_harness_api_is_refused() -> None:
    with pytest.raises(ValueError, match="kv-retention-hint"):
        args = parse("--api", "responses", "--kv-retention-hint", "5")
        plan_from_args(args, trace_from_args("coding", args))
    parser = argparse.ArgumentParser()
    add_replay_arguments(parser)
    args = parser.parse_args(
        [
            "--url",
            "http://127.0.0.1:1",
            "--trace",
            "t",
            "--out",
            "o",
            "--api",
            "messages",
            "--kv-retention-hint",
            "1",
        ]
    )
    assert run_replay(args) == 2  # refused before the trace is read
