"""No request field or header makes the router contact anything but a configured worker.

A canary server listens on loopback; every routing input a client controls names it (model, Rank header,
Host, absolute and authority-form request targets, ``agentic_context`` fields, forwarding headers, the
request-id headers, the body of every route). Afterwards the canary has seen no request at all. A worker
that answers with a redirect to the canary does not get it contacted either: redirects are relayed.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from aiohttp import web

from support.factories import EngineFactory, RouterFactory
from support.loopback import serve_app

from .conftest import MODEL, PROGRAM, Recorder, exchange, host_port


async def test_no_routing_input_reaches_a_url_that_is_not_a_worker(
    make_engine: EngineFactory,
    make_router: RouterFactory,
    make_recorder: object,
    client: aiohttp.ClientSession,
) -> None:
    canary: Recorder = await make_recorder()  # type: ignore[operator]
    engine = await make_engine()
    router = await make_router([engine.url], PROGRAM, intra_node_data_parallel_size=2, api_key="k")
    c_host, c_port = host_port(canary.url)
    here = f"{c_host}:{c_port}"
    context = {
        "program_id": canary.url,
        "task_id": canary.url + "/t",
        "agent_id": "//" + here,
        "parent_program_id": canary.url,
        "url": canary.url,
        "base_url": canary.url,
        "worker_url": canary.url,
    }
    bodies = [
        {"model": canary.url, "prompt": canary.url, "max_tokens": 2},
        {"model": MODEL, "messages": [{"role": "user", "content": canary.url}], "max_tokens": 2},
        {
            "model": MODEL,
            "prompt": "x",
            "max_tokens": 2,
            "vllm_xargs": {"agentic_context": json.dumps(context)},
        },
        {"model": MODEL, "prompt": "x", "max_tokens": 2, "vllm_xargs": {"agentic_context": context}},
        {"model": MODEL, "prompt": "x", "max_tokens": 2, "agentic_context": context, "url": canary.url},
    ]
    headers = {
        "X-data-parallel-rank": canary.url,
        "X-Forwarded-Host": here,
        "X-Forwarded-For": c_host,
        "Forwarded": f"host={here}",
        "X-Original-URL": canary.url,
        "X-Rewrite-URL": canary.url,
        "X-Request-Id": canary.url,
        "Referer": canary.url,
        "Origin": canary.url,
        "Location": canary.url,
    }
    paths = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/generate",
             "/tokenize", "/v1/embeddings", "/" + here + "/v1/completions"]  # fmt: skip
    for path in paths:
        for body in bodies:
            async with client.post(router.url + path, json=body, headers=headers) as resp:
                await resp.read()
    for path in ("/v1/models", "/health", "/scheduling/diagnostics", "/" + canary.url):
        async with client.get(router.url + path, headers=headers) as resp:
            await resp.read()
    payload = json.dumps(bodies[0]).encode()
    targets = [
        canary.url + "/v1/completions",  # absolute-form
        "//" + here + "/v1/completions",  # network-path reference
        here,  # authority-form (CONNECT-style)
        "@" + here + "/v1/completions",
        "http://" + here + "@127.0.0.1/v1/completions",
    ]
    for target in targets:
        for method in ("POST", "CONNECT", "GET"):
            await exchange(
                router.url,
                f"{method} {target} HTTP/1.1\r\nHost: {here}\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
                + payload,
            )
    assert canary.requests == []
    async with client.get(canary.url + "/control") as resp:  # the canary does record what reaches it
        assert resp.status == 200
    assert [r["path"] for r in canary.requests] == ["/control"]


async def test_a_worker_redirect_is_relayed_not_followed(
    make_recorder: Any, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    canary: Recorder = await make_recorder()

    async def redirect(request: web.Request) -> web.Response:
        if request.path == "/health":  # the router's own health checks are not a client's input
            return web.json_response({})
        raise web.HTTPTemporaryRedirect(canary.url + "/stolen")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", redirect)
    runner, worker_url = await serve_app(app)
    try:
        router = await make_router([worker_url])
        body = {"model": MODEL, "prompt": "x"}
        async with client.post(router.url + "/v1/completions", json=body, allow_redirects=False) as resp:
            assert resp.status == 307 and resp.headers["Location"] == canary.url + "/stolen"
        async with client.get(router.url + "/v1/models", allow_redirects=False) as resp:
            assert resp.status == 503  # the only worker did not answer with models
    finally:
        await runner.cleanup()
    assert canary.requests == []
