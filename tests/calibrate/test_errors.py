"""calibrate fails clearly (exit 2, a reason on stderr) when the backend cannot be measured."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from progrouter.cli import main

EngineFactory = Callable[..., str]

pytestmark = pytest.mark.timeout(60)
SMALL = ["--prefill-lengths", "64,128,256", "--prefill-repeats", "1", "--batch-sizes", "1,2",
         "--decode-contexts", "64,128", "--decode-tokens", "4", "--quiet"]  # fmt: skip


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_backend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.json"
    code = main(["calibrate", "--url", f"http://127.0.0.1:{closed_port()}", "--out", str(out), *SMALL])
    err = capsys.readouterr().err
    assert code == 2
    assert "progrouter calibrate: error: cannot reach the backend at http://127.0.0.1:" in err
    assert "Traceback" not in err
    assert not out.exists()


def test_backend_answering_errors(
    engine: EngineFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = engine("--fail-rate", "1.0")
    code = main(["calibrate", "--url", url, "--out", str(tmp_path / "c.json"), *SMALL])
    err = capsys.readouterr().err
    assert code == 2
    assert f"error: {url}/v1/completions answered HTTP 500" in err


def test_unknown_model_names_the_served_ones(
    engine: EngineFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = engine("--model-name", "served-one")
    code = main(["calibrate", "--url", url, "--model", "nope", "--out", str(tmp_path / "c.json"), *SMALL])
    err = capsys.readouterr().err
    assert code == 2
    assert "model 'nope' is not served" in err and "served-one" in err


def test_rank_out_of_range_is_reported(
    engine: EngineFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = engine("--data-parallel-size", "2")
    code = main(["calibrate", "--url", f"{url}@5", "--out", str(tmp_path / "c.json"), *SMALL])
    err = capsys.readouterr().err
    assert code == 2
    assert "answered HTTP 400" in err


def test_emit_router_config_from_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "calibration.json"
    src.write_text(json.dumps({
        "ttl_prefill_model_intercept_seconds": 0.03,
        "ttl_prefill_model_linear_seconds_per_1k_tokens": 0.07,
        "ttl_prefill_model_quadratic_seconds_per_1k_tokens_squared": 0.04,
        "decode_step_fixed_seconds": 0.003,
        "decode_step_seconds_per_request": 0.0004,
        "decode_step_seconds_per_context_token": 2e-7,
    }))  # fmt: skip
    assert main(["calibrate", "--from", str(src), "--emit-router-config"]) == 0
    fragment = json.loads(capsys.readouterr().out)
    assert fragment["prefill_cost_model"]["quadratic_seconds_per_1k_tokens_squared"] == 0.04
    assert fragment["decode_throughput_model"]["fixed_step_seconds"] == 0.003


def test_emit_router_config_rejects_an_invalid_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "calibration.json"
    src.write_text(json.dumps({"ttl_prefill_model_intercept_seconds": 0.03}))
    assert main(["calibrate", "--from", str(src), "--emit-router-config"]) == 2
    assert "lacks 'ttl_prefill_model_linear_seconds_per_1k_tokens'" in capsys.readouterr().err
