"""A worker that answers every GET with 307 to a canary server, and the canary that counts what reaches it.

The router contacts configured workers only: a redirect it followed would send its bearer key and its
traffic to wherever a worker points. Tests assert the canary saw nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

from support.loopback import serve_app


@dataclass
class Redirect:
    worker_url: str  # answers 307 to the canary, same path
    canary_hits: int = 0


@asynccontextmanager
async def redirect_to_canary() -> AsyncIterator[Redirect]:
    redirect = Redirect("")

    async def canary(_request: web.Request) -> web.Response:
        redirect.canary_hits += 1
        return web.Response(text="ok")

    canary_app = web.Application()
    canary_app.router.add_get("/{tail:.*}", canary)
    canary_runner, canary_url = await serve_app(canary_app)

    async def redirecting(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(canary_url + request.path)

    worker_app = web.Application()
    worker_app.router.add_get("/{tail:.*}", redirecting)
    worker_runner, redirect.worker_url = await serve_app(worker_app)
    try:
        yield redirect
    finally:
        await worker_runner.cleanup()
        await canary_runner.cleanup()
