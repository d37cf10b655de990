"""Helpers for the loopback tests: prompts, Program request bodies, SSE usage, polling, a metrics proxy."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from support.loopback import serve_app

MODEL = "emu"
BLOCK = 16
# One Rank's KV: 188 blocks x 16 = 3008 tokens; the router is told 3000, so both views of capacity agree.
ENGINE_BLOCKS = 188
CAPACITY = 3000
#: The emulator both Program tiers (loopback and through Envoy) run behind the router.
ENGINE_DEFAULTS: dict[str, Any] = {
    "model_name": MODEL,
    "num_blocks": ENGINE_BLOCKS,
    "block_size": BLOCK,
    "max_model_len": CAPACITY,
    "time_scale": 20.0,
}


def programs(d: dict[str, Any]) -> list[dict[str, Any]]:
    """Every Program of a diagnostics snapshot, over all Ranks."""
    return [p for r in d["ranks"] for p in r["programs"]]


def words(letter: str, n: int, start: int = 0) -> str:
    """``n`` three-letter words: 4 bytes per emulator token, as the router's default 0.25 tokens/byte."""
    return " ".join(f"{letter}{(start + i) % 100:02d}" for i in range(n))


def program_body(
    program_id: str,
    content: str,
    *,
    stream: bool = False,
    include_usage: bool = True,
    max_tokens: int = 4,
    **context: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "vllm_xargs": {"agentic_context": json.dumps({"program_id": program_id, **context})},
    }
    if stream:
        body["stream"] = True
        if include_usage:
            body["stream_options"] = {"include_usage": True}
    return body


async def read_sse_usage(response: aiohttp.ClientResponse) -> dict[str, Any] | None:
    usage = None
    async for raw in response.content:
        line = raw.decode().strip()
        if line.startswith("data:") and line != "data: [DONE]":
            event = json.loads(line[5:])
            if event.get("usage"):
                usage = event["usage"]
    return usage


async def wait_until(
    probe: Callable[[], Awaitable[Any]], condition: Callable[[Any], bool], timeout: float = 10.0
) -> Any:
    """Poll ``probe`` until ``condition`` holds; fail with the last value after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    value = await probe()
    while not condition(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout} s; last value: {value!r}")
        await asyncio.sleep(0.02)
        value = await probe()
    return value


@dataclass
class MetricsProxy:
    """Forwards a worker's API; counts ``GET /metrics`` and can make it fail."""

    upstream: str
    fail_metrics: bool = False
    metrics_hits: int = 0
    url: str = ""
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = field(default=None, repr=False)

    async def start(self) -> MetricsProxy:
        self._session = aiohttp.ClientSession()
        app = web.Application(client_max_size=1 << 26)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._forward)
        app.router.add_post("/{tail:.*}", self._forward)
        self._runner, self.url = await serve_app(app)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self.metrics_hits += 1
        if self.fail_metrics:
            return web.Response(status=500, text="metrics unavailable")
        return await self._forward(request)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=await request.read(), headers=headers
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
