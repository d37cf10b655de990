"""Forwarding: body bytes, headers, query strings, DP Rank headers, any POST path, merged models."""

from __future__ import annotations

import aiohttp
import orjson

from support.factories import RouterFactory

from .conftest import WorkerFactory

BODY = (
    b'{"model": "m",  "messages": [{"role": "user", "content": "hi"}],'
    b' "vllm_xargs": {"agentic_context": "{\\"program_id\\": \\"p\\"}"}, "n": 1.50}'
)


async def test_body_is_forwarded_byte_for_byte(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url])
    post = client.post(
        router.url + "/v1/chat/completions?trace=1", data=BODY, skip_auto_headers=["Content-Type"]
    )
    async with post as resp:
        assert resp.status == 200
        assert resp.headers["X-Worker"] == "w0"
        assert (await resp.json())["path"] == "/v1/chat/completions?trace=1"
    assert worker.requests[0]["raw"] == BODY
    assert worker.requests[0]["headers"]["Content-Type"] == "application/json"


async def test_headers_forwarded_except_hop_by_hop_and_the_client_authorization_kept(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], api_key="sk-worker")
    headers = {
        "X-Session-Id": "s1",
        "Authorization": "Bearer client-key",
        "Connection": "keep-alive, X-Private",
        "X-Private": "secret",
        "Keep-Alive": "timeout=5",
        "Proxy-Authorization": "Basic abc",
        "Content-Type": "application/json; charset=utf-8",
    }
    async with client.post(router.url + "/v1/completions", data=b'{"prompt": "x"}', headers=headers) as resp:
        assert resp.status == 200
    seen = {k.lower(): v for k, v in worker.requests[0]["headers"].items()}
    assert seen["x-session-id"] == "s1"
    assert seen["authorization"] == "Bearer client-key"  # an open router never swaps in the worker key
    assert seen["content-type"] == "application/json; charset=utf-8"
    for dropped in ("x-private", "keep-alive", "proxy-authorization", "accept-encoding"):
        assert dropped not in seen
    assert "x-data-parallel-rank" not in seen


async def test_inference_routes_are_proxied_as_received_and_nothing_else(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url])
    for path, payload in [("/v1/embeddings", b'{"input": "x"}'), ("/tokenize", b"not json at all")]:
        async with client.post(router.url + path, data=payload) as resp:
            assert resp.status == 200, path
    assert [r["path"] for r in worker.requests] == ["/v1/embeddings", "/tokenize"]
    assert worker.requests[1]["raw"] == b"not json at all"
    for path in ("/custom/op", "/sleep", "/collective_rpc", "/v1/load_lora_adapter", "/v1/chat/completionsX"):
        async with client.post(router.url + path, data=b"{}") as resp:
            assert resp.status == 404, path
            assert (await resp.json())["error"]["code"] == 404
    assert len(worker.requests) == 2


async def test_dp_ranks_expand_and_carry_the_rank_header(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    w0, w1 = await make_worker(), await make_worker()
    router = await make_router([w0.url, w1.url], intra_node_data_parallel_size=3)
    for _ in range(12):
        async with client.post(router.url + "/v1/completions", data=b'{"prompt": "x"}') as resp:
            assert resp.status == 200
    for worker in (w0, w1):
        ranks = sorted(r["headers"]["X-data-parallel-rank"] for r in worker.requests)
        assert ranks == ["0", "0", "1", "1", "2", "2"]


async def test_upstream_status_and_body_are_relayed(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url])
    async with client.post(router.url + "/v1/completions", json={"test_mode": "status:422"}) as resp:
        assert resp.status == 422
        assert await resp.json() == {"worker": "w0", "status": 422}


async def test_models_are_merged_across_healthy_workers(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    w0 = await make_worker(models=("a", "b"))
    w1 = await make_worker(models=("b", "c"))
    router = await make_router([w0.url, w1.url])
    async with client.get(router.url + "/v1/models") as resp:
        assert resp.status == 200
        data = (await resp.json())["data"]
    assert sorted(m["id"] for m in data) == ["a", "b", "c"]


async def test_models_503_when_no_worker_answers(
    make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    router = await make_router(["http://127.0.0.1:9"])
    async with client.get(router.url + "/v1/models") as resp:
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == 503


async def test_health_readiness_liveness_and_unknown_routes(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url])
    for path in ("/health", "/readiness", "/liveness"):
        async with client.get(router.url + path) as resp:
            assert resp.status == 200, path
    async with client.get(router.url + "/nope") as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["type"] == "not_found_error"
    async with client.get(router.url + "/scheduling/diagnostics") as resp:
        assert resp.status == 404
        assert "not enabled" in (await resp.json())["error"]["message"]


async def test_response_is_json_for_request_bodies_with_orjson_roundtrip(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url])
    async with client.post(router.url + "/generate", data=orjson.dumps({"text": "x"})) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/json")
