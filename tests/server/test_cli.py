"""`progrouter serve` as a user runs it: a subprocess, its exit code and its messages."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys

import aiohttp
import pytest

from progrouter.server.cli import add_arguments, config_from_args

from .conftest import WorkerFactory


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


def test_bad_worker_url_and_missing_workers() -> None:
    done = _serve("--worker-urls", "localhost:8000")
    assert done.returncode == 2 and "worker_urls" in done.stderr
    done = _serve()
    assert done.returncode == 2 and "--worker-urls" in done.stderr


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


async def test_serve_runs_until_sigterm(make_worker: WorkerFactory) -> None:
    worker = await make_worker()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "progrouter",
        "serve",
        "--worker-urls",
        worker.url,
        "--port",
        "0",
        "--prometheus-port",
        "0",
        "--policy",
        "round_robin",
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stderr is not None
    try:
        url = None
        while url is None:
            line = (await asyncio.wait_for(proc.stderr.readline(), timeout=30)).decode()
            assert line, "serve exited before listening"
            found = re.search(r"listening on (http://\S+)", line)
            url = found.group(1) if found else None
        async with aiohttp.ClientSession() as client, client.post(url + "/v1/completions", json={}) as resp:
            assert resp.status == 200
            assert resp.headers["X-Worker"] == worker.name
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
