"""Request ids (read or made up, echoed, forwarded, logged) and CORS (preflight, allow-origin, opt-in)."""

from __future__ import annotations

import logging
import re

import aiohttp
import pytest

from progrouter.server.edge.request_id import RequestIdFilter
from support.factories import RouterFactory

from .conftest import WorkerFactory


async def test_request_id_is_read_in_order_echoed_and_forwarded(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url])
    cases = [
        ({"x-request-id": "A1"}, "A1"),
        ({"x-correlation-id": "C1"}, "C1"),
        ({"x-trace-id": "T1"}, "T1"),
        ({"request-id": "R1"}, "R1"),
        ({"x-correlation-id": "C2", "x-request-id": "A2"}, "A2"),  # upstream's order: x-request-id first
    ]
    for headers, expected in cases:
        async with client.post(router.url + "/v1/completions", json={}, headers=headers) as resp:
            assert resp.status == 200 and resp.headers["X-Request-ID"] == expected
        assert worker.requests[-1]["headers"]["X-Request-ID"] == expected
    prefixes = (("/v1/chat/completions", "chatcmpl-"), ("/v1/completions", "cmpl-"), ("/tokenize", "req-"))
    for path, prefix in prefixes:
        async with client.post(router.url + path, json={}) as resp:
            rid = resp.headers["X-Request-ID"]
        assert re.fullmatch(re.escape(prefix) + "[A-Za-z0-9]{24}", rid)
        assert worker.requests[-1]["headers"]["X-Request-ID"] == rid
    for unusable in ("x" * 257, "a\tb"):  # too long, or a control character: replaced, never echoed
        async with client.post(router.url + "/tokenize", json={}, headers={"x-request-id": unusable}) as resp:
            assert resp.headers["X-Request-ID"].startswith("req-")
    async with client.get(router.url + "/health", headers={"x-request-id": "H1"}) as resp:
        assert resp.headers["X-Request-ID"] == "H1"  # the router's own answers too
    async with client.post(router.url + "/nope", headers={"x-request-id": "N1"}) as resp:
        assert resp.status == 404 and resp.headers["X-Request-ID"] == "N1"


async def test_custom_request_id_headers_replace_the_defaults_and_streams_echo_it(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    worker.release.set()
    router = await make_router([worker.url], request_id_headers=["x-my-id", "x-other"])
    headers = {"x-other": "O1", "x-my-id": "M1", "x-request-id": "ignored"}
    sse = {"test_mode": "sse"}
    async with client.post(router.url + "/v1/completions", json=sse, headers=headers) as resp:
        assert resp.headers["X-Request-ID"] == "M1"
        assert (await resp.read()).endswith(b"[DONE]\n\n")
    async with client.post(router.url + "/v1/completions", json={}, headers={"x-request-id": "A"}) as resp:
        assert resp.headers["X-Request-ID"].startswith("cmpl-")


async def test_every_log_line_of_a_request_names_its_id(
    make_worker: WorkerFactory,
    make_router: RouterFactory,
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad, good = await make_worker(), await make_worker()
    bad.mode = "status:500"
    router = await make_router([bad.url, good.url], retry_max_retries=2, retry_initial_backoff_ms=1)
    caplog.handler.addFilter(RequestIdFilter())
    with caplog.at_level(logging.DEBUG, logger="progrouter.proxy"):
        for rid in ("first", "second"):
            headers = {"x-request-id": rid}
            async with client.post(router.url + "/v1/completions", json={}, headers=headers) as resp:
                assert resp.status == 200
    proxy_lines = [r for r in caplog.records if r.name == "progrouter.proxy"]
    assert proxy_lines, "the proxy logs each answer at DEBUG and each failed attempt at INFO"
    assert {r.request_id for r in proxy_lines} == {"first", "second"}
    assert any(r.levelno == logging.INFO and "failed" in r.getMessage() for r in proxy_lines)


async def test_cors_preflight_and_allow_origin_for_listed_origins(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], cors_allowed_origins=["http://a.example", "http://b.example"])
    preflight = {
        "Origin": "http://a.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,authorization",
    }
    async with client.options(router.url + "/v1/completions", headers=preflight) as resp:
        assert resp.status == 200
        assert resp.headers["Access-Control-Allow-Origin"] == "http://a.example"
        assert resp.headers["Access-Control-Allow-Methods"] == "GET,POST,OPTIONS"
        assert resp.headers["Access-Control-Allow-Headers"] == "content-type,authorization"
        assert resp.headers["Access-Control-Max-Age"] == "3600"
    async with client.options(
        router.url + "/v1/completions", headers={**preflight, "Origin": "http://evil.example"}
    ) as resp:
        assert resp.status == 200 and "Access-Control-Allow-Origin" not in resp.headers
    assert worker.requests == []  # preflights are the router's
    listed = {"Origin": "http://b.example"}
    async with client.post(router.url + "/v1/completions", json={}, headers=listed) as resp:
        assert resp.headers["Access-Control-Allow-Origin"] == "http://b.example"
        assert resp.headers["Access-Control-Expose-Headers"] == "x-request-id"
    worker.release.set()
    async with client.post(
        router.url + "/v1/completions", json={"test_mode": "sse"}, headers={"Origin": "http://evil.example"}
    ) as resp:
        assert "Access-Control-Allow-Origin" not in resp.headers
        assert resp.headers["Access-Control-Expose-Headers"] == "x-request-id"
        await resp.read()
    star = await make_router([worker.url], cors_allowed_origins=["*"])
    anyone = {"Origin": "http://any.example"}
    async with client.post(star.url + "/v1/completions", json={}, headers=anyone) as resp:
        assert resp.headers["Access-Control-Allow-Origin"] == "*"


async def test_no_cors_headers_without_allowed_origins(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url])
    preflight = {"Origin": "http://a.example", "Access-Control-Request-Method": "POST"}
    async with client.options(router.url + "/v1/completions", headers=preflight) as resp:
        assert resp.status == 404  # no CORS layer: OPTIONS is not a route
        assert not [h for h in resp.headers if h.lower().startswith("access-control-")]
    origin = {"Origin": "http://a.example"}
    async with client.post(router.url + "/v1/completions", json={}, headers=origin) as resp:
        assert not [h for h in resp.headers if h.lower().startswith("access-control-")]
