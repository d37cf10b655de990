"""`progrouter epp` as a process: it waits for its workers, decides for Envoy, serves /metrics and the admin
routes, and exits 0 on SIGTERM."""

from __future__ import annotations

import asyncio
import re
import signal
import sys

import aiohttp
import pytest

from integration.helpers import program_body, words
from progrouter.epp.bootstrap import epp_bootstrap
from progrouter.epp.envoy import start_envoy
from support.factories import EngineFactory
from support.processes import _drain, _wait_for_line

pytestmark = pytest.mark.timeout(90)
STARTED = re.compile(r"ext_proc on (\S+), admin (\S+), metrics (\S+),")


async def test_the_command_serves_envoy_and_stops_on_sigterm(
    make_engine: EngineFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "progrouter", "epp",
        "--worker-urls", engine.url,
        "--host", "127.0.0.1", "--port", "0", "--admin-port", "0", "--prometheus-port", "0",
        "--enable-program-scheduling", "--log-level", "info",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    envoy = None
    drainer: asyncio.Task[None] | None = None
    try:
        grpc_address, admin, metrics = (await _wait_for_line(proc.stderr, STARTED, 30)).groups()
        drainer = asyncio.create_task(_drain(proc.stderr, []))  # a full pipe would block the EPP
        deadline = asyncio.get_running_loop().time() + 30
        while True:  # ready once the worker answered its health endpoint
            async with client.get(admin + "/readiness") as response:
                if response.status == 200:
                    break
            assert asyncio.get_running_loop().time() < deadline, "the EPP never became ready"
            await asyncio.sleep(0.05)
        host, port = grpc_address.rsplit(":", 1)
        envoy = await start_envoy(
            epp_bootstrap(
                (host, int(port)),
                queue_timeout_seconds=10,
                request_timeout_seconds=60,
                max_request_bytes=1 << 20,
            )
        )
        async with client.post(
            envoy.url + "/v1/chat/completions", json=program_body("prog-cli", words("c", 50))
        ) as r:
            assert r.status == 200
        async with client.get(metrics) as response:
            text = await response.text()
        assert 'progrouter_epp_decisions_total{decision="program"} 1.0' in text
        async with client.get(admin + "/scheduling/diagnostics") as response:
            assert (await response.json())["programs"] == 1
    finally:
        if envoy is not None:
            await envoy.stop()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        if drainer is not None:
            await drainer


@pytest.mark.parametrize(
    ("flag", "value", "field"), [("--admin-port", "70000", "admin_port"), ("--envoy-port", "0", "envoy_port")]
)
async def test_an_out_of_range_port_flag_is_one_line_naming_it(flag: str, value: str, field: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "progrouter", "epp", "--print-envoy-bootstrap", flag, value,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and out == b""
    lines = err.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("progrouter epp: ") and field in lines[0]
