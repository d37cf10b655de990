"""The bootstraps the EPP prints and bench uses pass Envoy's own validation, and say what docs/epp.md says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from progrouter.epp.bootstrap import round_robin_bootstrap
from progrouter.epp.envoy import envoy_binary

TIMEOUTS = {"queue_timeout_seconds": 42, "force_resume_timeout_seconds": 30}


def _validate(bootstrap: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(bootstrap))
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--disable-hot-restart", "-l", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _printed(*flags: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "progrouter", "epp", "--print-envoy-bootstrap", *flags],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    bootstrap: dict[str, Any] = json.loads(out)
    return bootstrap


def _ext_proc(bootstrap: dict[str, Any]) -> dict[str, Any]:
    [listener] = bootstrap["static_resources"]["listeners"]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    config: dict[str, Any] = hcm["http_filters"][0]["typed_config"]
    return config


def test_the_printed_bootstrap_is_valid_and_fails_closed(tmp_path: Path) -> None:
    bootstrap = _printed(
        "--worker-urls", "http://127.0.0.1:8000", "--enable-program-scheduling",
        "--host", "10.0.0.5", "--port", "9002", "--envoy-port", "8081",
        "--program-scheduling-config-json", json.dumps(TIMEOUTS),
    )  # fmt: skip
    _validate(bootstrap, tmp_path)
    ext_proc = _ext_proc(bootstrap)
    assert ext_proc["failure_mode_allow"] is False
    assert ext_proc["status_on_error"] == {"code": 503}  # a broken stream reached no worker: retryable
    assert ext_proc["message_timeout"] == "47.000s"  # the queue timeout and a margin
    assert ext_proc["processing_mode"]["request_body_mode"] == "BUFFERED"
    assert ext_proc["processing_mode"]["response_body_mode"] == "STREAMED"
    clusters = {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}
    assert clusters["workers"]["type"] == "ORIGINAL_DST"
    assert (
        clusters["workers"]["original_dst_lb_config"]["http_header_name"] == "x-gateway-destination-endpoint"
    )
    endpoint = clusters["epp"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {"address": "10.0.0.5", "port_value": 9002}


def test_the_printed_two_picker_bootstrap_fails_over_by_priority(tmp_path: Path) -> None:
    bootstrap = _printed(
        "--worker-urls", "http://127.0.0.1:8000", "--enable-program-scheduling",
        "--host", "10.0.0.5", "--port", "9002", "--epp-standby", "10.0.0.6:9002",
        "--epp-response-body", "end",
    )  # fmt: skip
    _validate(bootstrap, tmp_path)
    ext_proc = _ext_proc(bootstrap)
    assert ext_proc["failure_mode_allow"] is False
    assert ext_proc["processing_mode"]["response_body_mode"] == "NONE"
    clusters = {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}
    levels = clusters["epp"]["load_assignment"]["endpoints"]
    addresses = [
        (level["priority"], level["lb_endpoints"][0]["endpoint"]["address"]["socket_address"])
        for level in levels
    ]
    assert addresses == [
        (0, {"address": "10.0.0.5", "port_value": 9002}),
        (1, {"address": "10.0.0.6", "port_value": 9002}),
    ]
    [check] = clusters["epp"]["health_checks"]
    assert "grpc_health_check" in check
    assert clusters["epp"]["outlier_detection"]["consecutive_local_origin_failure"] == 1


def test_a_bad_standby_address_is_refused() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "progrouter", "epp", "--print-envoy-bootstrap", "--epp-standby", "10.0.0.6"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "epp_standby" in result.stderr and result.stdout == ""


def test_the_round_robin_bootstrap_is_valid(tmp_path: Path) -> None:
    bootstrap = round_robin_bootstrap(
        [("127.0.0.1", 8000), ("127.0.0.1", 8001)], request_timeout_seconds=60, max_request_bytes=1 << 20
    )
    _validate(bootstrap, tmp_path)


def test_an_unsupported_flag_is_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "progrouter", "epp", "--vllm-pd-disaggregation"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("progrouter epp: --vllm-pd-disaggregation: PD")


def test_the_epp_refuses_what_needs_kv_event_subscribers() -> None:
    """kv_aware and residency-aware scheduling read KV events, which only `serve` subscribes to."""
    for flags in (
        ["--policy", "kv_aware", "--worker-urls", "http://127.0.0.1:1"],
        [
            "--enable-program-scheduling",
            "--program-scheduling-config-json",
            '{"residency_aware": true, "kv_event_sources": {"http://127.0.0.1:1": "tcp://127.0.0.1:2"}}',
        ],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "progrouter", "epp", "--print-envoy-bootstrap", *flags],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, result.stdout + result.stderr
        assert "not supported by the EPP yet" in result.stderr
        assert result.stdout == ""
