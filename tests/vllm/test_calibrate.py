"""`progrouter calibrate` on real vLLM: a valid calibration.json with fit quality, and a usable fragment."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path

import pytest

from progrouter.calibrate.report import KEY_MAP
from progrouter.config import ProgramSchedulingConfig

from .conftest import NOTES, VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
PLAN = [
    "--prefill-lengths", "256,1024,2048,3072,4096", "--prefill-repeats", "3",
    "--batch-sizes", "1,2,4,8", "--decode-contexts", "128,512,1024", "--decode-tokens", "32",
]  # fmt: skip


async def test_calibrate_real_vllm(vllm_server: VllmServer, tmp_path: Path) -> None:
    out = tmp_path / "calibration.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "progrouter", "calibrate", "--url", f"{vllm_server.url}@0", "--out", str(out),
        "--emit-router-config", "--quiet", *PLAN,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    doc = json.loads(out.read_text())

    for key in KEY_MAP:
        assert isinstance(doc[key], float) and doc[key] >= 0, key
    assert doc["decode_step_fixed_seconds"] > 0
    quality = doc["fit_quality"]
    # 15 cold prefills kept; the fit takes the fastest repeat of each of the five lengths
    assert len(doc["samples"]["prefill"]) == 15 and quality["prefill"]["samples"] == 5
    assert quality["decode"]["samples"] == 12
    assert len(quality["prefill"]["residuals_seconds"]) == 5
    # Cold prefill on the tiny model is smooth (~30 ms at 256 tokens to ~1 s at 4k). Decode steps are a few
    # ms on a core shared with the API server, the router and the test itself: R² has been seen anywhere from
    # -2.7 to 0.96 across runs, so the tier asserts only that it is reported (the bar), not its value.
    assert quality["prefill"]["r_squared"] > 0.95
    assert math.isfinite(quality["decode"]["r_squared"]) and quality["decode"]["r_squared"] <= 1.0
    assert all(s["cached_tokens"] == 0 for s in doc["samples"]["prefill"])  # verified cold
    assert doc["samples"]["prompt_mode"] == "token_ids"
    assert doc["backend"]["kv_capacity_tokens"] == 16_384  # read from vllm:cache_config_info, engine 0
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"

    fragment = json.loads(stdout)
    config = ProgramSchedulingConfig.model_validate(fragment)
    assert config.prefill_cost_model.intercept_seconds == doc["ttl_prefill_model_intercept_seconds"]
    p4k = config.prefill_cost_model.prefill_seconds(4096)
    assert 0.1 < p4k < 10.0  # a real engine's cold 4k prefill, not the reference GPU's
    NOTES.append(
        "calibrate (tiny Llama, DP Rank 0, 1 core): "
        + ", ".join(f"{k}={doc[k]:.4g}" for k in KEY_MAP)
        + f"; R² prefill {quality['prefill']['r_squared']:.4f}, decode {quality['decode']['r_squared']:.4f}"
        + f"; modelled 4k cold prefill {p4k:.3f} s; file {out}"
    )
