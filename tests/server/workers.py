"""In-process aiohttp workers for router tests: real sockets on loopback, behaviour chosen per request.

The request body's ``test_mode`` picks the behaviour: ``echo`` (default), ``sse`` (one chunk, then wait for
``release``, then the rest), ``slow`` (never answers), ``status:<code>``, ``break`` (one SSE chunk, then the
connection drops), ``canned`` (the stream ``canned`` holds, chunk by chunk, then its end), ``canned_cut``
(the same chunks, then the connection drops), ``canned_json`` (``canned_json`` as the JSON answer). A worker
can also be scripted regardless of the body: ``script`` is a list of modes used up one per request (e.g.
``["status:500"] * 3`` fails the first three, ``"close"`` drops the connection without an answer), and
``mode`` is the mode once the script is used up.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from support.loopback import serve_app


class FakeWorker:
    def __init__(self, name: str, models: tuple[str, ...] = ("model-a",)) -> None:
        self.name = name
        self.models = models
        self.healthy = True
        self.requests: list[dict[str, Any]] = []
        self.received = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.health_checks = 0
        self.script: list[str] = []
        self.mode: str | None = None
        self.canned: list[bytes] = []  # the chunks of a canned stream (an Anthropic or Responses SSE, say)
        self.canned_json: dict[str, Any] = {}
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> FakeWorker:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/{tail:.*}", self._post)
        self._runner, self.url = await serve_app(app)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        self.health_checks += 1
        return web.Response(status=200 if self.healthy else 503, text="ok" if self.healthy else "down")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": m, "owned_by": self.name} for m in self.models]}
        )

    async def _post(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        mode = body.get("test_mode", "echo") if isinstance(body, dict) else "echo"
        if self.script:
            mode = self.script.pop(0)
        elif self.mode is not None:
            mode = self.mode
        self.requests.append(
            {"path": request.path_qs, "headers": dict(request.headers), "raw": raw, "mode": mode}
        )
        self.received.set()
        try:
            if mode == "slow":
                await asyncio.sleep(3600)
            if mode == "close":
                assert request.transport is not None
                request.transport.close()
                return web.Response()
            if mode.startswith("status:"):
                code = int(mode.split(":")[1])
                return web.json_response({"worker": self.name, "status": code}, status=code)
            if mode == "canned_json":
                return web.json_response(self.canned_json, headers={"X-Worker": self.name})
            if mode in ("canned", "canned_cut"):
                resp = web.StreamResponse(
                    headers={"Content-Type": "text/event-stream", "X-Worker": self.name}
                )
                await resp.prepare(request)
                for chunk in self.canned:
                    await resp.write(chunk)
                if mode == "canned_cut":
                    assert request.transport is not None
                    request.transport.close()
                    return resp
                await resp.write_eof()
                return resp
            if mode in ("sse", "break"):
                resp = web.StreamResponse(
                    headers={"Content-Type": "text/event-stream", "X-Worker": self.name}
                )
                await resp.prepare(request)
                await resp.write(b'data: {"n": 1}\n\n')
                if mode == "break":
                    assert request.transport is not None
                    request.transport.close()
                    return resp
                await self.release.wait()
                await resp.write(b'data: {"n": 2}\n\n')
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
                return resp
            return web.json_response(
                {"worker": self.name, "path": request.path_qs}, headers={"X-Worker": self.name}
            )
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
