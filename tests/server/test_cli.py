"""`progrouter serve` as a user runs it: a subprocess, its exit code and its messages."""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys

import pytest

from progrouter.config import RouterConfig
from progrouter.config_cli import flag_name
from progrouter.server.cli import add_arguments, config_from_args


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "progrouter", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--program-scheduling-config-json", "{}"], ["requires enable_program_scheduling"]),
        (
            ["--enable-program-scheduling", "--program-scheduling-config-json", "{nope"],
            ["Invalid program_scheduling_config_json", "double quotes"],
        ),
        (
            ["--enable-program-scheduling", "--program-scheduling-config-json", '{"low_watermark_ratio": 0}'],
            ["low_watermark_ratio", "watermarks"],
        ),
        (
            [
                "--enable-program-scheduling",
                "--program-scheduling-config-json",
                '{"queue_timout_seconds": 5}',
            ],
            ["unknown field 'queue_timout_seconds'"],
        ),
        (["--cache-threshold", "2"], ["cache_threshold"]),
        (["--intra-node-data-parallel-size", "0"], ["intra_node_data_parallel_size"]),
    ],
)
def test_invalid_configuration_exits_2_naming_the_field(args: list[str], fragments: list[str]) -> None:
    done = _serve("--worker-urls", "http://127.0.0.1:1", "--port", "0", *args)
    assert done.returncode == 2
    for fragment in fragments:
        assert fragment in done.stderr


def test_bad_worker_url() -> None:
    done = _serve("--worker-urls", "localhost:8000")
    assert done.returncode == 2 and "worker_urls" in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--vllm-pd-disaggregation"],
        ["--prefill", "http://p:1", "9000"],
        ["--decode", "http://d:1"],
        ["--prefill-policy", "cache_aware"],
        ["--decode-policy", "random"],
        ["--pd-kv-events", "http://p:1=tcp://x:1"],
        ["--prefill-selector", "a=b"],
        ["--decode-selector", "a=b"],
        ["--vllm-discovery-address", "0.0.0.0:30001"],
        ["--kv-connector", "mooncake"],
        ["--mini-lb"],
    ],
)
def test_pd_flags_fail_with_one_line(args: list[str]) -> None:
    done = _serve("--worker-urls", "http://127.0.0.1:1", *args)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"progrouter serve: {args[0]}: PD (prefill/decode disaggregated) mode")


@pytest.mark.parametrize(
    ("args", "feature"),
    [
        (["--wasm-middleware", "/x.wasm"], "WASM middleware"),
        (["--wasm-middleware-sha256", "ab"], "WASM middleware"),
        (["--wasm-middleware-route", "/v1/x"], "WASM middleware"),
        (["--enable-igw"], "IGW"),
        (["--service-discovery"], "Kubernetes service discovery"),
        (["--selector", "app=vllm"], "Kubernetes service discovery"),
        (["--service-discovery-port", "80"], "Kubernetes service discovery"),
        (["--service-discovery-namespace", "ns"], "Kubernetes service discovery"),
    ],
)
def test_unsupported_feature_flags_fail_with_one_line_naming_the_flag(args: list[str], feature: str) -> None:
    done = _serve(*args)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"progrouter serve: {args[0]}: {feature}")
    assert "not supported" in done.stderr


def test_kv_aware_flags_reach_the_config() -> None:
    args = _parser().parse_args([
        "--worker-urls", "http://w:1", "--policy", "kv_aware", "--kv-penalty-host", "0.5",
        "--kv-event-source", "http://w:1=tcp://w:5557", "--kv-event-replay-source", "http://w:1=tcp://w:5567",
        "--kv-event-block-size", "32", "--kv-event-model", "m", "--router-temperature", "0.1",
        "--kv-aware-session-affinity-ttl-secs", "60", "--tokenizer", "/models/m",
    ])  # fmt: skip
    config = config_from_args(args, environ={})
    assert (config.policy, config.kv_penalty_host, config.kv_event_block_size) == ("kv_aware", 0.5, 32)
    assert config.kv_event_source == ["http://w:1=tcp://w:5557"]
    assert config.kv_event_replay_source == ["http://w:1=tcp://w:5567"]
    assert (config.router_temperature, config.kv_aware_session_affinity_ttl_secs) == (0.1, 60)
    assert (config.kv_event_model, config.tokenizer) == ("m", "/models/m")


def test_kv_aware_misconfiguration_is_one_line() -> None:
    done = _serve("--policy", "round_robin", "--kv-event-source", "http://w:1=tcp://w:5557")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert "--kv-event-source requires the kv_aware policy" in done.stderr


def test_an_unreadable_tokenizer_ends_startup_with_one_line(tmp_path: pathlib.Path) -> None:
    done = _serve(
        "--policy", "kv_aware", "--tokenizer", str(tmp_path), "--port", "0", "--prometheus-port", "off"
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert "holds no tokenizer.json" in done.stderr


def test_version_and_help_shows_defaults() -> None:
    done = _serve("--version")
    assert done.returncode == 0 and done.stdout.startswith("progrouter ")
    done = _serve("--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for fragment in (
        "--max-tree-size MAX_TREE_SIZE cache_aware: characters kept per worker, enforced at eviction "
        "(default: 33554432)",
        "(default: cache_aware)",
        "--retry-max-retries RETRY_MAX_RETRIES attempts per request in all (1: no retry) (default: 5)",
        "--worker-startup-timeout-secs",
        "(default: 600)",
        "--drain-timeout-secs",
    ):
        assert fragment in text
    assert "--prefill [ARG ...] PD mode" in text and "--enable-igw [ARG ...] IGW" in text  # listed, refused


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_win_over_environment_over_config_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(
        "worker_urls: [http://file:1]\npolicy: random\nmax_tree_size: 1000\nqueue_size: 7\n"
        "program_scheduling: {binding_only: true}\n"
    )
    env = {"PROGROUTER_POLICY": "power_of_two", "PROGROUTER_QUEUE_SIZE": "8", "UNRELATED": "x"}
    config = config_from_args(_parse("--config", str(path), "--queue-size", "9"), env)
    assert config.worker_urls == ["http://file:1"] and config.max_tree_size == 1000  # file only
    assert config.policy.value == "power_of_two"  # env over file
    assert config.queue_size == 9  # flag over env
    assert config.program_scheduling is not None and config.program_scheduling.binding_only
    env["PROGROUTER_WORKER_URLS"] = '["http://env:1", "http://env:2"]'
    config = config_from_args(_parse("--config", str(path)), env)
    assert config.worker_urls == ["http://env:1", "http://env:2"] and config.queue_size == 8
    assert config_from_args(_parse(), {}).max_tree_size == 2**25  # defaults without file or env


def test_config_file_errors_name_the_key(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "router.json"
    path.write_text('{"policy": "random", "max_tre_size": 5}')
    done = _serve("--config", str(path))
    assert done.returncode == 2 and "unknown field 'max_tre_size'" in done.stderr
    assert str(path) in done.stderr
    path.write_text("- a list\n")
    done = _serve("--config", str(path))
    assert done.returncode == 2 and "must hold a mapping" in done.stderr
    done = _serve("--config", str(tmp_path / "missing.yaml"))
    assert done.returncode == 2 and "cannot read config file" in done.stderr


def test_prometheus_port_off() -> None:
    assert config_from_args(_parse("--prometheus-port", "off"), {}).prometheus_port is None
    assert config_from_args(_parse("--prometheus-port", "0"), {}).prometheus_port == 0
    assert config_from_args(_parse(), {"PROGROUTER_PROMETHEUS_PORT": "null"}).prometheus_port is None
    assert config_from_args(_parse(), {}).prometheus_port == 29000


def test_flags_map_onto_router_config() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--worker-urls", "http://a:1/", "http://b:2",
            "--policy", "power_of_two",
            "--intra-node-data-parallel-size", "4",
            "--api-key", "k",
            "--retry-max-retries", "2",
            "--health-check-endpoint", "/ping",
            "--enable-program-scheduling",
            "--program-scheduling-config-json", '{"token_capacity_per_target": 456, "enable_key": "auto"}',
        ]
    )  # fmt: skip
    config = config_from_args(args)
    assert config.worker_urls == ["http://a:1", "http://b:2"]
    assert config.policy.value == "power_of_two"
    assert config.intra_node_data_parallel_size == 4
    assert config.api_key == "k" and config.retry_max_retries == 2
    assert config.health_check_endpoint == "/ping"
    assert config.program_scheduling is not None
    assert config.program_scheduling.token_capacity_per_dp_rank == 456
    assert config.program_scheduling.program_scheduling_enable_key.value == "auto"


def _sample(action: argparse.Action) -> tuple[list[str], object]:
    """Command-line words for one generated flag, and the value its field should receive."""
    flag = action.option_strings[0]
    if action.nargs == 0:  # a switch
        return [flag], action.const
    if action.choices:
        return [flag, str(list(action.choices)[-1])], str(list(action.choices)[-1])
    if isinstance(action, argparse._AppendAction):
        return [flag, "a", flag, "b"], ["a", "b"]
    if action.nargs == "*":
        return [flag, "a", "b"], ["a", "b"]
    if action.type in (int, float):
        return [flag, "7"], action.type("7")
    return [flag, "v"], "v"


def test_every_settings_flag_lands_in_its_field() -> None:
    """A flag whose value reached no RouterConfig field would be dropped without a word."""
    parser = _parser()
    settings = [a for a in parser._actions if a.dest in RouterConfig.model_fields]
    assert {a.dest for a in settings} == {
        name for name, field in RouterConfig.model_fields.items() if flag_name(name, field) is not None
    }
    for action in settings:
        words, expected = _sample(action)
        assert vars(parser.parse_args(words)) == {"config": None, action.dest: expected}, words
