"""The worker-management API over loopback: upstream's shapes and status codes; routing follows it."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web

from support.factories import RouterFactory
from support.loopback import serve_app

from .conftest import WorkerFactory

pytestmark = pytest.mark.timeout(60)


async def call(client: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> tuple[int, str, str]:
    async with client.request(method, url, **kw) as resp:
        return resp.status, resp.content_type, await resp.text()


async def test_add_list_remove_workers_and_routing_follows(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    first, second = await make_worker("first"), await make_worker("second")
    router = await make_router([first.url], worker_startup_timeout_secs=5, worker_startup_check_interval=0.1)
    base = router.url

    assert await call(client, "GET", base + "/list_workers") == (
        200,
        "application/json",
        f'{{"urls":["{first.url}"]}}',
    )
    status, ctype, text = await call(client, "POST", base + "/add_worker", params={"url": second.url + "/"})
    assert (status, ctype, text) == (200, "text/plain", f"Successfully added worker: {second.url}")
    status, _, text = await call(client, "POST", base + "/add_worker", params={"url": second.url})
    assert (status, text) == (400, f"Worker {second.url} already exists")
    status, _, text = await call(client, "POST", base + "/add_worker")
    assert (status, text) == (400, "Failed to deserialize query string: missing field `url`")
    status, _, text = await call(client, "POST", base + "/add_worker", params={"url": "localhost:1"})
    assert status == 400 and "http or https" in text
    _, _, text = await call(client, "GET", base + "/list_workers")
    assert text == f'{{"urls":["{first.url}","{second.url}"]}}'
    assert first.requests == [] and second.requests == []  # admin calls are never proxied

    for _ in range(4):
        async with client.post(base + "/v1/completions", json={"prompt": "x"}) as resp:
            assert resp.status == 200
    assert len(first.requests) == 2 and len(second.requests) == 2  # round robin over both

    status, _, text = await call(client, "POST", base + "/remove_worker", params={"url": first.url})
    assert (status, text) == (200, f"Successfully removed worker: {first.url}")
    status, _, text = await call(client, "POST", base + "/remove_worker", params={"url": first.url})
    assert (status, text) == (200, f"Successfully removed worker: {first.url}")  # absent: still 200
    for _ in range(3):
        async with client.post(base + "/v1/completions", json={"prompt": "x"}) as resp:
            assert resp.status == 200
    assert len(first.requests) == 2 and len(second.requests) == 5
    assert router.registry.get_sample_value("vllm_router_worker_health", {"worker": first.url}) is None
    assert router.registry.get_sample_value("vllm_router_cb_state", {"worker": first.url}) is None
    assert router.registry.get_sample_value("vllm_router_cb_state", {"worker": second.url}) == 0
    assert router.registry.get_sample_value("vllm_router_worker_health", {"worker": second.url}) == 1


async def test_add_worker_waits_for_health_and_times_out(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    sick = await make_worker("sick")
    sick.healthy = False
    router = await make_router([], worker_startup_timeout_secs=0.5, worker_startup_check_interval=0.1)
    status, _, text = await call(client, "POST", router.url + "/add_worker", params={"url": sick.url})
    assert status == 400 and text.startswith(f"Timeout 0.5s waiting for worker {sick.url} to become healthy")
    assert sick.health_checks >= 2  # it kept checking until the deadline
    assert await call(client, "GET", router.url + "/list_workers") == (200, "application/json", '{"urls":[]}')
    async with client.get(router.url + "/readiness") as resp:
        assert resp.status == 503
        assert await resp.json() == {
            "status": "not_ready", "reason": "no healthy workers available", "total_workers": 0
        }  # fmt: skip
    sick.healthy = True
    status, _, _ = await call(client, "POST", router.url + "/add_worker", params={"url": sick.url})
    assert status == 200
    async with client.get(router.url + "/readiness") as resp:
        assert resp.status == 200
        assert await resp.json() == {"status": "ready", "healthy_workers": 1, "total_workers": 1}


async def test_workers_resource(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    one, two = await make_worker(), await make_worker()
    router = await make_router([one.url], worker_startup_timeout_secs=5, worker_startup_check_interval=0.1)
    workers = router.url + "/workers"
    async with client.get(workers) as resp:
        assert resp.status == 200
        assert await resp.json() == {
            "workers": [
                {
                    "url": one.url,
                    "model_id": "unknown",
                    "worker_type": "regular",
                    "is_healthy": True,
                    "load": 0,
                    "connection_mode": "Http",
                    "priority": 50,
                    "cost": 1.0,
                }
            ],
            "total": 1,
            "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": 1},
        }
    async with client.post(workers, json={"url": two.url}) as resp:
        assert resp.status == 200
        assert await resp.json() == {"success": True, "message": f"Successfully added worker: {two.url}"}
    async with client.post(workers, json={"url": two.url}) as resp:
        assert resp.status == 400
        assert await resp.json() == {"error": f"Worker {two.url} already exists", "code": "ADD_WORKER_FAILED"}
    async with client.post(workers, json={}) as resp:
        assert resp.status == 422
    one_path = workers + "/" + quote(one.url, safe="")
    async with client.get(one_path) as resp:
        assert await resp.json() == {"url": one.url, "model_id": "unknown", "is_healthy": True}
    async with client.get(workers + "/nothere") as resp:
        assert resp.status == 404
        assert await resp.json() == {"error": "Worker nothere not found", "code": "WORKER_NOT_FOUND"}
    async with client.delete(one_path) as resp:
        assert resp.status == 200
        assert await resp.json() == {"success": True, "message": f"Worker {one.url} removed successfully"}
    async with client.get(workers) as resp:
        body = await resp.json()
        assert [w["url"] for w in body["workers"]] == [two.url] and body["total"] == 1
    assert one.requests == [] and two.requests == []


async def _load_worker(load: object, flush_status: int) -> tuple[web.AppRunner, str, list[str]]:
    """A worker answering ``/get_load`` and ``/flush_cache`` (which the emulator does not)."""
    seen: list[str] = []

    async def get_load(request: web.Request) -> web.Response:
        seen.append("get_load")
        return web.json_response({"load": load})

    async def flush(request: web.Request) -> web.Response:
        seen.append("flush_cache")
        return web.Response(status=flush_status)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/get_load", get_load)
    app.router.add_post("/flush_cache", flush)
    app.router.add_get("/health", health)
    runner, url = await serve_app(app)
    return runner, url, seen


async def test_get_loads_and_flush_cache(make_router: RouterFactory, client: aiohttp.ClientSession) -> None:
    runner_a, a, seen_a = await _load_worker(7, 200)
    runner_b, b, seen_b = await _load_worker("busy", 200)
    try:
        router = await make_router([a, b])
        async with client.get(router.url + "/get_loads") as resp:
            assert await resp.json() == {"workers": [{"worker": a, "load": 7}, {"worker": b, "load": -1}]}
        assert await call(client, "POST", router.url + "/flush_cache") == (
            200, "text/plain", "Cache flushed on all servers"
        )  # fmt: skip
        assert seen_a == seen_b == ["get_load", "flush_cache"]
        await runner_b.cleanup()
        assert await call(client, "POST", router.url + "/flush_cache") == (
            500, "text/plain", "Cache flush failed on one or more servers"
        )  # fmt: skip
    finally:
        await runner_a.cleanup()
        await runner_b.cleanup()


async def test_wrong_methods_are_405_and_never_proxied(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url])
    for method, path in [("GET", "/flush_cache"), ("GET", "/add_worker"), ("DELETE", "/remove_worker"),
                         ("POST", "/list_workers"), ("PUT", "/workers/x")]:  # fmt: skip
        status, _, _ = await call(client, method, router.url + path)
        assert status == 405, (method, path)
    assert worker.requests == []


async def test_health_checks_cover_added_workers(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router(
        [], health_check_interval_secs=0.05, health_failure_threshold=1, worker_startup_check_interval=0.05
    )
    async with client.post(router.url + "/add_worker", params={"url": worker.url}) as resp:
        assert resp.status == 200
    worker.healthy = False
    deadline = asyncio.get_running_loop().time() + 10
    while router.registry.get_sample_value("vllm_router_worker_health", {"worker": worker.url}) != 0:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)
    async with client.get(router.url + "/readiness") as resp:
        assert resp.status == 503
    async with client.get(router.url + "/workers") as resp:
        assert (await resp.json())["workers"][0]["is_healthy"] is False


async def test_dp_ranks_are_listed_as_upstream_lists_them(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router(
        [worker.url], intra_node_data_parallel_size=2, worker_startup_check_interval=0.1
    )
    ranks = [f"{worker.url}@0", f"{worker.url}@1"]
    _, _, text = await call(client, "GET", router.url + "/list_workers")
    assert text == f'{{"urls":["{ranks[0]}","{ranks[1]}"]}}'
    async with client.get(router.url + "/workers") as resp:
        body = await resp.json()
        assert [w["url"] for w in body["workers"]] == ranks and body["total"] == 2
    async with client.get(router.url + "/readiness") as resp:
        assert await resp.json() == {"status": "ready", "healthy_workers": 2, "total_workers": 2}
    status, _, _ = await call(client, "POST", router.url + "/remove_worker", params={"url": ranks[0]})
    assert status == 200  # a Rank is not a worker: nothing removed, as upstream
    _, _, text = await call(client, "GET", router.url + "/list_workers")
    assert text == f'{{"urls":["{ranks[0]}","{ranks[1]}"]}}'
    await call(client, "POST", router.url + "/remove_worker", params={"url": worker.url})
    assert await call(client, "GET", router.url + "/list_workers") == (200, "application/json", '{"urls":[]}')
    await call(client, "POST", router.url + "/add_worker", params={"url": worker.url})
    _, _, text = await call(client, "GET", router.url + "/list_workers")
    assert text == f'{{"urls":["{ranks[0]}","{ranks[1]}"]}}'
