"""`progrouter calibrate` against the engine emulator, whose step time comes from known coefficients."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from progrouter.cli import main
from progrouter.config import ProgramSchedulingConfig

EngineFactory = Callable[..., str]

pytestmark = pytest.mark.timeout(240)

# Wall-clock coefficients; the emulator gets them ×SCALE and runs SCALE× faster, so what calibrate sees on
# the wire (and multiplies back by --time-scale SCALE) is SCALE× these. HTTP overhead is not scaled by the
# emulator, so the intercept is kept large against it (~2 ms on loopback) and may exceed its true value by
# the round trip: up to HTTP_SLACK_WALL of latency (a busy 2-core machine measured 7–20 ms), never less.
# The emulator charges modelled time (it sleeps to each step's deadline), so a loaded host only ever adds
# late wake-ups: every per-token and per-request term is kept large against them (at load 11–17 on 2 cores
# they reach 25–50 ms on a 3 s prefill), calibrate takes the fastest of four prefill repeats and a
# least-squares slope over each 48-token decode window.
SCALE = 4.0
HTTP_SLACK_WALL = 0.025
WALL = {
    "intercept_seconds": 0.1,
    "linear_seconds_per_1k_tokens": 0.2,
    "quadratic_seconds_per_1k_tokens_squared": 0.02,
    "fixed_step_seconds": 0.012,
    "batch_step_seconds_per_request": 0.003,
    "context_step_seconds_per_token": 3e-6,
}
KEYS = {
    "intercept_seconds": "ttl_prefill_model_intercept_seconds",
    "linear_seconds_per_1k_tokens": "ttl_prefill_model_linear_seconds_per_1k_tokens",
    "quadratic_seconds_per_1k_tokens_squared": "ttl_prefill_model_quadratic_seconds_per_1k_tokens_squared",
    "fixed_step_seconds": "decode_step_fixed_seconds",
    "batch_step_seconds_per_request": "decode_step_seconds_per_request",
    "context_step_seconds_per_token": "decode_step_seconds_per_context_token",
}


def test_fit_recovers_emulator_coefficients_within_5_percent(
    engine: EngineFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = [f"--{name.replace('_', '-')}={value * SCALE!r}" for name, value in WALL.items()]
    url = engine("--time-scale", str(SCALE), "--num-blocks", "4096", "--max-model-len", "16384", *flags)
    out = tmp_path / "calibration.json"
    code = main(
        [
            "calibrate", "--url", url, "--out", str(out), "--quiet", "--emit-router-config",
            "--time-scale", str(SCALE), "--prefill-lengths", "512,2048,4096,8192", "--prefill-repeats", "4",
            "--batch-sizes", "1,3,6", "--decode-contexts", "256,2048", "--decode-tokens", "48",
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    doc = json.loads(out.read_text())
    for name, wall in WALL.items():
        fitted = doc[KEYS[name]]
        if name == "intercept_seconds":  # the fixed cost also carries the unscaled HTTP round trip
            assert wall * SCALE * 0.95 <= fitted <= wall * SCALE * 1.05 + HTTP_SLACK_WALL * SCALE, fitted
        else:
            assert fitted == pytest.approx(wall * SCALE, rel=0.05), (name, fitted, wall * SCALE)
    quality = doc["fit_quality"]
    assert quality["prefill"]["r_squared"] > 0.99 and quality["decode"]["r_squared"] > 0.99
    # every repeat is kept in the file; the fit takes the fastest of each length's four
    assert len(doc["samples"]["prefill"]) == 16 and quality["prefill"]["samples"] == 4
    assert quality["decode"]["samples"] == 6
    assert all(s["cached_tokens"] == 0 for s in doc["samples"]["prefill"])  # cold, verified
    assert doc["samples"]["prompt_mode"] == "token_ids"
    assert [s["prompt_tokens"] for s in doc["samples"]["prefill"]].count(8192) == 4  # exact lengths
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The stdout fragment is exactly the six coefficients and is a valid program_scheduling config.
    fragment = json.loads(captured.out)
    assert fragment == {
        "prefill_cost_model": {k: doc[KEYS[k]] for k in list(WALL)[:3]},
        "decode_throughput_model": {k: doc[KEYS[k]] for k in list(WALL)[3:]},
    }
    config = ProgramSchedulingConfig.model_validate(fragment)
    assert config.defaulted_calibration_fields() == ["prefill_cost_model.decode_throughput_alpha"]
    assert "decode_throughput_alpha" in captured.err
