"""`progrouter engine` as a subprocess: flags, readiness line, a request, clean shutdown on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import sys

import aiohttp
import pytest

from progrouter.engine.cli import add_arguments, config_from_namespace

pytestmark = pytest.mark.timeout(60)


def test_flags_build_the_config() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--port", "0", "--data-parallel-size", "2", "--num-blocks", "100", "--block-size", "32",
         "--max-model-len", "3200", "--time-scale", "50", "--fixed-step-seconds", "0.02",
         "--quadratic-seconds-per-1k-tokens-squared", "0.001", "--slow-factor", "2"]
    )  # fmt: skip
    config = config_from_namespace(args)
    assert config.data_parallel_size == 2 and config.block_size == 32 and config.time_scale == 50
    assert config.decode_throughput_model.fixed_step_seconds == 0.02
    assert config.prefill_cost_model.quadratic_seconds_per_1k_tokens_squared == 0.001
    assert config.prefill_cost_model.intercept_seconds == 0.06600061907132926  # untouched default
    assert config.slow_factor == 2
    assert config_from_namespace(parser.parse_args(["--num-blocks", "10"])).max_model_len == 160
    assert config_from_namespace(parser.parse_args([])).max_model_len == 32768
    with pytest.raises(ValueError, match="max_model_len"):
        config_from_namespace(parser.parse_args(["--num-blocks", "10", "--max-model-len", "1000"]))


async def test_subprocess_serves_and_stops_on_sigterm() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "progrouter", "engine", "--port", "0", "--time-scale", "100",
        "--num-blocks", "128", "--max-model-len", "2048", "--data-parallel-size", "2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        match = re.search(r"on (http://\S+) ", line)
        assert match, line
        url = match.group(1)
        async with aiohttp.ClientSession() as session:
            body = {"prompt": "hello world", "max_tokens": 3}
            async with session.post(
                url + "/v1/completions", json=body, headers={"X-data-parallel-rank": "1"}
            ) as r:
                assert r.status == 200
                assert (await r.json())["usage"]["completion_tokens"] == 3
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
