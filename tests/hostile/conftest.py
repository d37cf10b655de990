"""The hostile client's kit: raw sockets, a recording server (header echo and SSRF canary), error checks.

``make_engine``, ``make_router`` and ``client`` come from the root tests/conftest.py. The emulator serves one
small model; the routers here run Program scheduling unless a test says otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from progrouter.server.runner import RunningRouter
from support.factories import EngineFactory, RouterFactory
from support.loopback import serve_app
from support.stopping import stopping

MODEL = "emu"
PROGRAM: dict[str, Any] = {"token_capacity_per_dp_rank": 3000}
MAX_PAYLOAD = 65536


@pytest.fixture
def engine_defaults() -> dict[str, Any]:
    return {
        "model_name": MODEL,
        "num_blocks": 188,
        "block_size": 16,
        "max_model_len": 3000,
        "time_scale": 50.0,
    }


@dataclass
class Recorder:
    """A loopback HTTP server that records every request: a header-echo worker, or a canary that must stay
    silent. It answers like a tiny OpenAI worker so a router can use it as one."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    runner: web.AppRunner | None = None

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        if request.path != "/health":
            self.requests.append({"method": request.method, "path": request.path, "headers": request.headers})
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": MODEL}]})
        return web.json_response({"choices": [{"text": "ok", "index": 0}], "usage": {"total_tokens": 1}})


async def start_recorder() -> Recorder:
    recorder = Recorder()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    recorder.runner, recorder.url = await serve_app(app)
    return recorder


@pytest.fixture
async def make_recorder() -> AsyncIterator[Callable[[], Awaitable[Recorder]]]:
    async with stopping(start_recorder) as make:
        yield make


@pytest.fixture
async def program_router(make_engine: EngineFactory, make_router: RouterFactory) -> RunningRouter:
    """The router with Program scheduling in front of one emulator Rank; bodies up to 64 KiB."""
    engine = await make_engine()
    return await make_router([engine.url], PROGRAM, max_payload_size=MAX_PAYLOAD)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> str:
        """The reason of a JSON error reply (asserts the shape)."""
        assert self.headers.get("content-type", "").startswith("application/json"), self
        payload = orjson.loads(self.body)
        assert set(payload["error"]) == {"message", "type", "code"}, payload
        assert payload["error"]["code"] == self.status
        message = payload["error"]["message"]
        assert isinstance(message, str) and message
        return message


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def parse_reply(raw: bytes) -> Reply:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = headers.get("content-length")
    return Reply(status, headers, body if length is None else body[: int(length)])


async def exchange(url: str, data: bytes, *, timeout: float = 10.0) -> Reply:
    """Send raw bytes on a fresh connection and read the first reply (the server closes or answers once)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(*host_port(url)), timeout)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(timeout):
            raw = await read_reply(reader)
    finally:
        writer.close()
    return parse_reply(raw)


async def read_reply(reader: asyncio.StreamReader) -> bytes:
    """One HTTP reply: the head, then Content-Length bytes (or up to EOF)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        None,
    )
    body = await (reader.readexactly(length) if length is not None else reader.read())
    return head + body


async def json_post(client: aiohttp.ClientSession, url: str, data: bytes, **kw: Any) -> Reply:
    async with client.post(url, data=data, **kw) as resp:
        return Reply(resp.status, {k.lower(): v for k, v in resp.headers.items()}, await resp.read())


async def diagnostics(client: aiohttp.ClientSession, router: RunningRouter) -> Any:
    async with client.get(router.url + "/scheduling/diagnostics") as resp:
        assert resp.status == 200
        return await resp.json()


async def assert_alive(client: aiohttp.ClientSession, router: RunningRouter, within: float = 2.0) -> None:
    """/liveness answers 200 within ``within`` seconds (a bounded deadline, not a measured time)."""
    async with asyncio.timeout(within), client.get(router.url + "/liveness") as resp:
        assert resp.status == 200
