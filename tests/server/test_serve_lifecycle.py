"""`progrouter serve` as a subprocess from start to exit: startup wait, drain on SIGTERM, the log file."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from support.factories import EngineFactory
from support.serve import Serve, serving

from .conftest import WorkerFactory

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    async with serving() as start:
        yield start


async def _status(client: aiohttp.ClientSession, url: str) -> int:
    async with client.get(url) as resp:
        return resp.status


async def _until_status(client: aiohttp.ClientSession, url: str, status: int, timeout: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while (last := await _status(client, url)) != status:
        assert asyncio.get_running_loop().time() < deadline, f"{url} stayed {last}, expected {status}"
        await asyncio.sleep(0.05)


async def test_serve_waits_for_a_worker_then_becomes_ready(
    serve: Serve, make_worker: WorkerFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    worker.healthy = False
    proc, url = await serve(
        "--worker-urls", worker.url, "--worker-startup-timeout-secs", "60",
        "--worker-startup-check-interval", "0.1", "--policy", "round_robin", "--prometheus-port", "0",
    )  # fmt: skip
    await _until_status(client, worker.url + "/health", 503)
    assert await _status(client, url + "/readiness") == 503
    assert await _status(client, url + "/liveness") == 200
    while worker.health_checks < 3:  # it keeps checking while the worker is not up
        await asyncio.sleep(0.05)
    assert await _status(client, url + "/readiness") == 503
    worker.healthy = True
    await _until_status(client, url + "/readiness", 200)
    async with client.post(url + "/v1/completions", json={"prompt": "x"}) as resp:
        assert resp.status == 200 and resp.headers["X-Worker"] == worker.name
    assert worker.requests[0]["raw"] == b'{"prompt": "x"}'
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 30) == 0


async def test_serve_exits_1_when_no_worker_answers_in_time(serve: Serve) -> None:
    proc, _ = await serve(
        "--worker-urls", "http://127.0.0.1:1", "--worker-startup-timeout-secs", "0.5",
        "--worker-startup-check-interval", "0.1",
    )  # fmt: skip
    assert await asyncio.wait_for(proc.wait(), 30) == 1
    assert proc.stderr is not None
    rest = (await proc.stderr.read()).decode()
    assert "Timeout 0.5s waiting for workers ['http://127.0.0.1:1'] to become healthy" in rest


async def test_serve_without_workers_serves_and_takes_them_at_runtime(
    serve: Serve, make_worker: WorkerFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    proc, url = await serve("--worker-startup-check-interval", "0.1")
    assert await _status(client, url + "/readiness") == 503
    async with client.post(url + "/add_worker", params={"url": worker.url}) as resp:
        assert resp.status == 200
    assert await _status(client, url + "/readiness") == 200
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 30) == 0


async def test_sigterm_drains_streams_refuses_new_requests_and_exits_0(
    serve: Serve, make_engine: EngineFactory, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    engine = await make_engine(time_scale=0.05)  # 20x slower than modelled: the stream takes seconds
    proc, url = await serve(
        "--worker-urls", engine.url, "--drain-timeout-secs", "60", "--log-dir", str(tmp_path / "logs"),
    )  # fmt: skip
    await _until_status(client, url + "/readiness", 200)
    body = {"model": "progrouter-emulated", "prompt": "hello " * 20, "max_tokens": 40, "stream": True}
    async with client.post(url + "/v1/completions", json=body) as stream:
        assert stream.status == 200
        first = await stream.content.readline()
        assert first.startswith(b"data: ")
        proc.send_signal(signal.SIGTERM)
        await _until_status(client, url + "/readiness", 503)
        async with client.post(url + "/v1/completions", json={**body, "stream": False}) as refused:
            assert refused.status == 503 and refused.headers["Retry-After"] == "1"
        rest = await stream.content.read()
    assert rest.rstrip().endswith(b"data: [DONE]")  # the stream in flight finished whole
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    log = (tmp_path / "logs" / "progrouter.log").read_text()
    assert "listening on" in log and "draining: 1 request(s) in progress" in log


async def test_sigterm_during_the_startup_wait_exits_0(
    serve: Serve, make_worker: WorkerFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    worker.healthy = False
    proc, url = await serve("--worker-urls", worker.url, "--worker-startup-check-interval", "0.1")
    while worker.health_checks < 2:
        await asyncio.sleep(0.05)
    assert await _status(client, url + "/readiness") == 503
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 30) == 0
