"""A scriptable loopback worker: answers like a vLLM server, or fails, stalls or crashes on cue.

The differential tests put it behind both routers (ours and the upstream wheel, which runs as a separate
process), so it serves from the test's event loop and is scripted by changing its ``Script`` between
requests. ``GET`` health/info routes are never scripted: a router's health checks must not eat the
failures meant for the proxied requests.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from aiohttp import web

from support.loopback import serve_app

HEALTH_PATHS = frozenset(
    {"/health", "/v1/models", "/get_server_info", "/get_model_info", "/metrics", "/get_load"}
)


LOAD = 7  # what GET /get_load reports (sglang-style load endpoint the wheel's /get_loads asks)


@dataclass
class Script:
    """What the next proxied requests get: the first ``fail_first`` answer ``fail_status``, then ``status``.

    ``stall`` holds every proxied request until it is cleared (``release()``); ``crash`` closes the
    connection without an answer.
    """

    status: int = 200
    fail_first: int = 0
    fail_status: int = 500
    crash: bool = False
    stall: bool = False
    health_status: int = 200  # what GET /health answers


@dataclass
class Seen:
    """One request as the worker received it (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]


@dataclass
class ScriptedWorker:
    url: str
    runner: web.AppRunner
    script: Script = field(default_factory=Script)
    seen: list[Seen] = field(default_factory=list)
    stalled: int = 0
    _gate: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def counts(self) -> Counter[str]:
        """Requests received per path (health checks included)."""
        return Counter(s.path for s in self.seen)

    @property
    def proxied(self) -> list[Seen]:
        """The requests a router forwarded (everything but health/info GETs)."""
        return [s for s in self.seen if not (s.method == "GET" and s.path in HEALTH_PATHS)]

    def reset(self, script: Script | None = None) -> None:
        """A fresh script and fresh counts, for the next scenario on the same worker."""
        self.release()
        self.script = script or Script()
        self.seen.clear()

    def release(self) -> None:
        """Let every stalled request go (they then answer per the script, stall cleared)."""
        self.script.stall = False
        self._gate.set()
        self._gate = asyncio.Event()

    async def stop(self) -> None:
        self.release()
        await self.runner.cleanup()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.seen.append(Seen(request.method, request.path, headers))
        if request.method == "GET" and request.path in HEALTH_PATHS:
            return _info(request.path, self.script.health_status)
        return await self._scripted(request)

    async def _scripted(self, request: web.Request) -> web.StreamResponse:
        script = self.script
        while script.stall:
            self.stalled += 1
            try:
                await self._gate.wait()
            finally:
                self.stalled -= 1
        if script.crash:
            assert request.transport is not None
            request.transport.close()
            await asyncio.Event().wait()  # handler_cancellation ends the handler with the connection
        if script.fail_first > 0:
            script.fail_first -= 1
            return _answer(script.fail_status)
        return _answer(script.status)


def _answer(status: int) -> web.Response:
    if status >= 400:
        return web.json_response({"error": {"message": f"scripted {status}", "code": status}}, status=status)
    return web.json_response(
        {
            "id": "cmpl-scripted",
            "object": "text_completion",
            "model": "scripted",
            "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        },
        status=status,
    )


def _info(path: str, health_status: int) -> web.Response:
    if path == "/health":
        return web.Response(status=health_status)
    if path == "/v1/models":
        return web.json_response({"object": "list", "data": [{"id": "scripted", "object": "model"}]})
    if path == "/get_load":
        return web.json_response({"load": LOAD})
    if path == "/metrics":
        return web.Response(text="", content_type="text/plain")
    return web.json_response({"status": "ok", "model_path": "scripted", "model_id": "scripted"})


async def start_scripted_worker(script: Script | None = None) -> ScriptedWorker:
    """A scripted worker on a free loopback port, serving from the running event loop."""
    holder: list[ScriptedWorker] = []

    async def dispatch(request: web.Request) -> web.StreamResponse:
        return await holder[0].handle(request)

    app = web.Application(client_max_size=1 << 30)
    app.router.add_route("*", "/{tail:.*}", dispatch)
    runner, url = await serve_app(app)
    worker = ScriptedWorker(url=url, runner=runner, script=script or Script())
    holder.append(worker)
    return worker
