"""Every error path answers JSON with the right status, and the router survives all of them."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest

from support.factories import RouterFactory

from .conftest import WorkerFactory


def _closed_port_url() -> str:
    """A loopback URL where nothing listens (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def _error(resp: aiohttp.ClientResponse) -> dict[str, object]:
    payload = await resp.json()
    assert set(payload["error"]) == {"message", "type", "code"}
    assert payload["error"]["code"] == resp.status
    return dict(payload["error"])


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [(b"{not json", "malformed JSON"), (b"[1, 2]", "JSON object"), (b"", "malformed JSON")],
)
async def test_bad_json_on_a_json_route_is_400(
    make_worker: WorkerFactory,
    make_router: RouterFactory,
    client: aiohttp.ClientSession,
    payload: bytes,
    fragment: str,
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url])
    async with client.post(router.url + "/v1/chat/completions", data=payload) as resp:
        assert resp.status == 400
        assert fragment in str((await _error(resp))["message"])
    assert worker.requests == []


async def test_payload_over_the_limit_is_413(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], max_payload_size=1000)
    big = b'{"prompt": "' + b"x" * 2000 + b'"}'
    async with client.post(router.url + "/v1/completions", data=big) as resp:  # with Content-Length
        assert resp.status == 413
        await _error(resp)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"x" * 500

    async with client.post(router.url + "/v1/completions", data=chunks()) as resp:  # chunked, no length
        assert resp.status == 413
    async with client.post(router.url + "/v1/completions", data=b'{"prompt": "ok"}') as resp:
        assert resp.status == 200
    assert len(worker.requests) == 1


async def test_no_healthy_worker_is_503(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    worker.healthy = False
    router = await make_router(
        [worker.url], health_check_interval_secs=0.02, health_failure_threshold=1, health_success_threshold=1
    )
    await _wait_status(client, router.url + "/readiness", 503)
    async with client.post(router.url + "/v1/completions", json={"prompt": "x"}) as resp:
        assert resp.status == 503
        assert "no healthy workers" in str((await _error(resp))["message"])
    assert worker.requests == []


async def test_connection_error_is_502_with_the_cause(
    make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    dead = _closed_port_url()
    router = await make_router([dead])
    async with client.post(router.url + "/v1/completions", json={"prompt": "x"}) as resp:
        assert resp.status == 502
        message = str((await _error(resp))["message"])
    assert "unreachable" in message and dead in message


async def test_retry_goes_to_another_worker_when_the_first_is_unreachable(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    dead = _closed_port_url()
    # round robin over both workers' Ranks hits the dead worker within every two requests
    router = await make_router(
        [dead, worker.url], retry_max_retries=2, retry_initial_backoff_ms=1, intra_node_data_parallel_size=2
    )
    for _ in range(4):
        async with client.post(router.url + "/v1/completions", json={"prompt": "x"}) as resp:
            assert resp.status == 200
    assert len(worker.requests) == 4
    without_retry = await make_router([dead], retry_max_retries=1)
    async with client.post(without_retry.url + "/v1/completions", json={"prompt": "x"}) as resp:
        assert resp.status == 502


async def test_retryable_status_is_retried_elsewhere_then_relayed_when_exhausted(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    w0, w1 = await make_worker(), await make_worker()
    router = await make_router([w0.url, w1.url], retry_max_retries=2, retry_initial_backoff_ms=1)
    async with client.post(router.url + "/v1/completions", json={"test_mode": "status:503"}) as resp:
        # both workers answer 503: the first is retried, the second (last attempt) is relayed as-is
        assert resp.status == 503
        assert (await resp.json())["status"] == 503
    assert len(w0.requests) == 1 and len(w1.requests) == 1
    async with client.post(router.url + "/v1/completions", json={"test_mode": "status:501"}) as resp:
        assert resp.status == 501  # not a retryable status (upstream retries 408, 429, 500, 502-504)
    assert len(w0.requests) + len(w1.requests) == 3


async def test_request_timeout_is_504_and_aborts_the_worker(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], request_timeout_secs=0.2)
    async with client.post(router.url + "/v1/completions", json={"test_mode": "slow"}) as resp:
        assert resp.status == 504
        assert "timed out" in str((await _error(resp))["message"])
    await _wait_event(worker.cancelled)


async def test_unhealthy_worker_ranks_leave_the_candidates_and_come_back(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    w0, w1 = await make_worker(), await make_worker()
    router = await make_router(
        [w0.url, w1.url],
        intra_node_data_parallel_size=2,
        health_check_interval_secs=0.02,
        health_failure_threshold=2,
        health_success_threshold=2,
    )
    w0.healthy = False
    await _wait_status(client, router.url + "/health", 503)
    async with client.get(router.url + "/health") as resp:
        assert (await resp.json())["unhealthy_workers"] == [w0.url]
    for _ in range(6):
        async with client.post(router.url + "/v1/completions", json={"prompt": "x"}) as resp:
            assert resp.status == 200
    assert w0.requests == [] and len(w1.requests) == 6
    assert {r["headers"]["X-data-parallel-rank"] for r in w1.requests} == {"0", "1"}
    w0.healthy = True
    await _wait_status(client, router.url + "/health", 200)
    for _ in range(4):
        async with client.post(router.url + "/v1/completions", json={"prompt": "x"}) as resp:
            assert resp.status == 200
    assert len(w0.requests) == 2


async def _wait_status(client: aiohttp.ClientSession, url: str, status: int) -> None:
    async def poll() -> None:
        while True:
            async with client.get(url) as resp:
                if resp.status == status:
                    return
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout=10)


async def _wait_event(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), timeout=5)
