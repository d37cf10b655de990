"""Serve an aiohttp app on loopback at a free port: the one start-up every fake server in the tests shares."""

from __future__ import annotations

from typing import Any

from aiohttp import web


async def serve_app(app: web.Application, **runner_options: Any) -> tuple[web.AppRunner, str]:
    """Start ``app`` on 127.0.0.1:0; return its runner (``cleanup()`` stops it) and its base URL."""
    options: dict[str, Any] = {"handler_cancellation": True, "access_log": None, **runner_options}
    runner = web.AppRunner(app, **options)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"
