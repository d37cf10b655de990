"""Engine profiles: the built-ins reproduce their measurements, a calibration.json works, bad input is
refused, and `progrouter engine --engine-profile` serves with the profile's KV size and step costs."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from progrouter.config import ProgramSchedulingConfig
from progrouter.engine.cli import add_arguments, config_from_namespace
from progrouter.engine.profiles import BUILTIN, ProfileError, load_profile, with_cost_models

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("name", "tokens", "seconds"),
    # The measured cold prefills of the H200 data (fit within 3 %).
    [("h200-llama-8b", 32768, 1.623), ("h200-llama-8b", 131072, 16.441), ("h200-qwen-32b", 65536, 15.260),
     ("h200-qwen-32b", 4096, 0.456)],
)  # fmt: skip
def test_h200_profiles_reproduce_the_measured_prefill(name: str, tokens: int, seconds: float) -> None:
    profile = load_profile(name)
    assert profile.prefill_cost_model.prefill_seconds(tokens) == pytest.approx(seconds, rel=0.03)


def test_h200_profiles_carry_the_kv_and_decode_of_the_data() -> None:
    small, large = load_profile("h200-llama-8b"), load_profile("h200-qwen-32b")
    assert 900_000 < small.kv_tokens_per_rank < 950_000
    assert 280_000 < large.kv_tokens_per_rank < 300_000
    # decode step: 5.0 ms + 15.9 us per request + 28.1 ns per context token (8B); 17.6 ms ... (32B)
    assert small.decode_throughput_model.step_seconds(8, 8 * 32768) == pytest.approx(
        0.005 + 8 * 15.9e-6 + 8 * 32768 * 28.1e-9, rel=0.03
    )
    assert large.decode_throughput_model.fixed_step_seconds == pytest.approx(0.0176, rel=0.01)
    assert small.num_blocks(256) == small.kv_tokens_per_rank // 256


def test_reference_is_the_router_default() -> None:
    reference = load_profile("reference")
    defaults = ProgramSchedulingConfig()
    assert reference.prefill_cost_model == defaults.prefill_cost_model
    assert reference.decode_throughput_model == defaults.decode_throughput_model


def test_every_builtin_loads() -> None:
    assert [load_profile(n).name for n in BUILTIN] == list(BUILTIN)


def test_calibration_file_is_a_profile(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    doc = {
        "format": "progrouter-calibration/1",
        "ttl_prefill_model_intercept_seconds": 0.01,
        "ttl_prefill_model_linear_seconds_per_1k_tokens": 0.07,
        "ttl_prefill_model_quadratic_seconds_per_1k_tokens_squared": 0.04,
        "decode_step_fixed_seconds": 0.004,
        "decode_step_seconds_per_request": 6e-5,
        "decode_step_seconds_per_context_token": 3e-7,
        "backend": {"url": "http://x", "model": "m", "max_model_len": 4096, "kv_capacity_tokens": 16384},
    }
    path.write_text(json.dumps(doc))
    profile = load_profile(str(path))
    assert profile.kv_tokens_per_rank == 16384 and profile.max_model_len == 4096
    assert profile.prefill_cost_model.linear_seconds_per_1k_tokens == 0.07
    assert profile.decode_throughput_model.context_step_seconds_per_token == 3e-7
    del doc["backend"]
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match="kv_capacity_tokens"):
        load_profile(str(path))


def test_bad_profiles_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="h200-llama-8b"):
        load_profile("h100-llama")
    path = tmp_path / "p.json"
    path.write_text("[1]")
    with pytest.raises(ProfileError, match="not a JSON object"):
        load_profile(str(path))
    path.write_text(json.dumps({"format": "progrouter-engine-profile/1", "kv_tokens_per_rank": 10,
                                "prefill_cost_model": {"intercept_seconds": -1}}))  # fmt: skip
    with pytest.raises(ProfileError, match="intercept_seconds"):
        load_profile(str(path))
    path.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ProfileError, match="format"):
        load_profile(str(path))


def test_program_config_gets_the_profile_costs_under_its_own() -> None:
    profile = load_profile("h200-qwen-32b")
    given = {"global_queue": True, "prefill_cost_model": {"decode_throughput_alpha": 0.3}}
    config = with_cost_models(given, profile.prefill_cost_model, profile.decode_throughput_model)
    parsed = ProgramSchedulingConfig.model_validate(config)
    assert parsed.prefill_cost_model.linear_seconds_per_1k_tokens == pytest.approx(0.1036, rel=0.01)
    assert parsed.prefill_cost_model.decode_throughput_alpha == 0.3  # the experiment's own setting wins
    assert parsed.decode_throughput_model == profile.decode_throughput_model


def test_engine_flag_sets_kv_and_costs_and_flags_override() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    profile = load_profile("h200-qwen-32b")
    config = config_from_namespace(parser.parse_args(["--engine-profile", "h200-qwen-32b"]))
    assert config.num_blocks == profile.kv_tokens_per_rank // 16 and config.block_size == 16
    assert config.max_model_len == 131072
    assert config.prefill_cost_model == profile.prefill_cost_model
    assert config.decode_throughput_model == profile.decode_throughput_model
    config = config_from_namespace(
        parser.parse_args(["--engine-profile", "h200-qwen-32b", "--block-size", "256", "--fixed-step-seconds",
                           "0.5", "--num-blocks", "1000"])
    )  # fmt: skip
    assert config.num_blocks == 1000 and config.block_size == 256
    assert config.decode_throughput_model.fixed_step_seconds == 0.5
    assert config.prefill_cost_model == profile.prefill_cost_model
    assert config_from_namespace(parser.parse_args(["--engine-profile", "cpu-tiny"])).block_size == 32


async def test_engine_serves_with_the_profile_step_costs() -> None:
    """A cold 4,096-token prefill on the 32B profile takes its modelled 0.46 s (time scale 10: ~46 ms)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "progrouter", "engine", "--port", "0", "--engine-profile", "h200-qwen-32b",
        "--time-scale", "10", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        match = re.search(r"on (http://\S+) \(1 Rank\(s\) x (\d+) blocks of 16", line)
        assert match, line
        assert int(match.group(2)) == load_profile("h200-qwen-32b").kv_tokens_per_rank // 16
        async with aiohttp.ClientSession() as session:
            body = {"prompt": list(range(100, 4196)), "max_tokens": 1}
            started = time.perf_counter()
            async with session.post(match.group(1) + "/v1/completions", json=body) as r:
                assert r.status == 200
                usage = (await r.json())["usage"]
            elapsed = time.perf_counter() - started
        assert usage["prompt_tokens"] == 4096
        modelled = load_profile("h200-qwen-32b").prefill_cost_model.prefill_seconds(4096)
        assert elapsed >= modelled / 10 * 0.9  # never faster than the profile says (wall = modelled / 10)
    finally:
        proc.terminate()
        await proc.wait()


def test_engine_refuses_an_unknown_profile() -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "progrouter", "engine", "--engine-profile", "nope"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "unknown engine profile 'nope'" in done.stderr
