"""An in-process stand-in for a vLLM server, for replay tests: records what arrives and when it ends.

It streams ``max_tokens`` one-word chunks and a usage chunk (cached = the longest common prefix, in whole
16-token blocks, with any earlier prompt of the same session). ``hold`` lets a test make a request wait for an
event; ``fail_programs`` answers 500 for some Programs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

BLOCK = 16


@dataclass
class Seen:
    program_id: str
    step: int
    context: dict[str, Any]
    body: dict[str, Any]
    headers: dict[str, str]
    arrived: float
    ended: float | None = None


@dataclass
class FakeEngine:
    seen: list[Seen] = field(default_factory=list)
    fail_programs: set[str] = field(default_factory=set)
    hold: Callable[[Seen], asyncio.Future[None] | None] = lambda _s: None
    delay: float = 0.0
    prompts: dict[str, list[list[int]]] = field(default_factory=dict)
    url: str = ""

    def by_program(self) -> dict[str, list[Seen]]:
        out: dict[str, list[Seen]] = {}
        for s in self.seen:
            out.setdefault(s.program_id, []).append(s)
        return out

    async def models(self, _req: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def completions(self, req: web.Request) -> web.StreamResponse:
        body = orjson.loads(await req.read())
        ctx = orjson.loads(body["vllm_xargs"]["agentic_context"])
        seen = Seen(ctx["program_id"], ctx["step_id"], ctx, body, dict(req.headers), time.perf_counter())
        self.seen.append(seen)
        if ctx["program_id"] in self.fail_programs:
            seen.ended = time.perf_counter()
            return web.json_response({"error": {"message": "boom"}}, status=500)
        held = self.hold(seen)
        if held is not None:
            await held
        if self.delay:
            await asyncio.sleep(self.delay)
        if "prompt" in body:
            prompt = list(body["prompt"])
        else:
            prompt = [hash(w) for w in body["messages"][0]["content"].split()]
        session = req.headers.get("x-session-id", "")
        cached = 0
        for earlier in self.prompts.get(session, []):
            n = 0
            for a, b in zip(earlier, prompt, strict=False):
                if a != b:
                    break
                n += 1
            cached = max(cached, n // BLOCK * BLOCK)
        self.prompts.setdefault(session, []).append(prompt)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream", "x-data-parallel-rank": "1"})
        await resp.prepare(req)
        for _ in range(body["max_tokens"]):
            chunk = {"choices": [{"index": 0, "text": " x"}]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": body["max_tokens"],
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        await resp.write(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        seen.ended = time.perf_counter()
        await resp.write_eof()
        return resp


@asynccontextmanager
async def running(fake: FakeEngine) -> AsyncIterator[FakeEngine]:
    app = web.Application()
    app.router.add_get("/v1/models", fake.models)
    app.router.add_post("/v1/completions", fake.completions)
    app.router.add_post("/v1/chat/completions", fake.completions)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    fake.url = f"http://127.0.0.1:{port}"
    try:
        yield fake
    finally:
        await runner.cleanup()
