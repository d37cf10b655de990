"""Request ids (read, generate, echo) and CORS preflight: the same on progrouter and the wheel."""

from __future__ import annotations

import re

import aiohttp

from .conftest import Launcher, WorkerFactory, flags
from .helpers import get, post

CHAT = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
GENERATED = re.compile(r"[A-Za-z0-9]{24}")


async def test_request_id_default_headers_echo_and_generate(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    (worker,) = await workers(1)
    router = await launch(kind, flags([worker.url]))
    for name in ("x-request-id", "x-correlation-id", "x-trace-id", "request-id"):
        answer = await post(http, router.url, headers={name: f"id-{name}"})
        assert answer.headers.get("x-request-id") == f"id-{name}", name
        assert worker.proxied[-1].headers.get(name) == f"id-{name}"  # forwarded under its own name
    # None given: one is generated, with the OpenAI-style prefix of the route.
    generated = {
        path: (await post(http, router.url, path=path, body=body)).headers.get("x-request-id", "")
        for path, body in (("/v1/completions", None), ("/v1/chat/completions", CHAT))
    }
    prefixes = {path: rid.rpartition("-")[0] + "-" for path, rid in generated.items()}
    assert prefixes == {"/v1/completions": "cmpl-", "/v1/chat/completions": "chatcmpl-"}
    assert all(GENERATED.fullmatch(rid.rpartition("-")[2]) for rid in generated.values()), generated


async def test_request_id_headers_flag_replaces_the_defaults(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    (worker,) = await workers(1)
    ids = ["--request-id-headers", "x-my-id", "x-other-id"]
    router = await launch(kind, flags([worker.url], *ids))

    async def echoed(headers: dict[str, str]) -> str:
        return (await post(http, router.url, headers=headers)).headers.get("x-request-id", "")

    assert await echoed({"x-other-id": "o1"}) == "o1"
    assert await echoed({"x-other-id": "o1", "x-my-id": "m1"}) == "m1"  # the flag's order decides
    assert (await echoed({"x-request-id": "r1"})).startswith("cmpl-")  # defaults no longer read


async def test_cors_preflight_for_allowed_origins(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    (worker,) = await workers(1)
    cors = ["--cors-allowed-origins", "http://a.example"]
    router = await launch(kind, flags([worker.url], *cors))
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    allowed_url = router.url + "/v1/completions"
    allowed = await get(http, allowed_url, "OPTIONS", headers={"Origin": "http://a.example", **preflight})
    other = await get(http, allowed_url, "OPTIONS", headers={"Origin": "http://evil.example", **preflight})
    assert allowed.status == 200
    assert allowed.headers.get("access-control-allow-origin") == "http://a.example"
    assert "POST" in allowed.headers.get("access-control-allow-methods", "")
    assert "content-type" in allowed.headers.get("access-control-allow-headers", "").lower()
    assert "access-control-allow-origin" not in other.headers
    simple = await post(http, router.url, headers={"Origin": "http://a.example"})
    assert (simple.status, simple.headers.get("access-control-allow-origin")) == (200, "http://a.example")
    assert len(worker.proxied) == 1  # preflights are answered by the router, never proxied


async def test_api_key_and_the_clients_authorization(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    """On an open router ``--api-key`` is the router's own credential (health checks, metrics polling): a
    proxied request carries the client's Authorization unchanged and never the router's key."""
    (worker,) = await workers(1)
    router = await launch(kind, flags([worker.url], "--api-key", "routerkey"))
    await post(http, router.url)
    await post(http, router.url, headers={"Authorization": "Bearer client"})
    seen = [s.headers.get("authorization") for s in worker.proxied]
    assert seen == [None, "Bearer client"]
