"""The engine emulator with a test tap: every request carrying ``X-Fault-Request-Id`` is logged on arrival.

Run as a script (``python tapped_engine.py --tap-log FILE <progrouter engine flags>``) so a fault test can
kill it with SIGKILL and start it again on the same port. Each arrival is one JSON line written with a single
``write`` on an ``O_APPEND`` descriptor, so the log survives a kill and lines from several processes never
interleave. The tap also adds one switch the emulator lacks: ``POST /tap/metrics`` with
``{"mode": "ok"|"fail"|"hang"}`` makes ``GET /metrics`` answer 500 or never answer (the /metrics outage).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

TAP_HEADER = "X-Fault-Request-Id"
RANK_HEADER = "X-data-parallel-rank"
READY = "TAPPED-ENGINE-READY"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def read_arrivals(path: Path) -> list[dict[str, Any]]:
    """Every arrival logged so far: ``{"id", "t" (monotonic), "rank", "port"}``."""
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def tap_middleware(log_path: Path, port: Callable[[], int]) -> Any:
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    metrics_mode = {"mode": "ok"}

    @web.middleware
    async def tap(request: web.Request, handler: Handler) -> web.StreamResponse:
        rid = request.headers.get(TAP_HEADER)
        if rid is not None and request.method == "POST":
            line = {
                "id": rid,
                "t": time.monotonic(),
                "rank": request.headers.get(RANK_HEADER),
                "port": port(),
            }
            os.write(fd, orjson.dumps(line) + b"\n")
        if request.path == "/tap/metrics" and request.method == "POST":
            metrics_mode["mode"] = str((await request.json())["mode"])
            return web.json_response(metrics_mode)
        if request.path == "/metrics" and metrics_mode["mode"] != "ok":
            if metrics_mode["mode"] == "hang":
                await asyncio.Event().wait()
            return web.Response(status=500, text="metrics outage (fault injection)")
        return await handler(request)

    return tap


async def _serve(args: argparse.Namespace) -> None:
    from progrouter.engine.cli import config_from_namespace
    from progrouter.engine.server import EngineServer

    config = config_from_namespace(args)
    server = EngineServer(config)
    app = server.app()
    bound: list[int] = [config.port]
    app.middlewares.append(tap_middleware(Path(args.tap_log), lambda: bound[0]))
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, config.host, config.port).start()
    bound[0] = int(runner.addresses[0][1])
    print(f"{READY} {bound[0]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> None:
    from progrouter.engine.cli import add_arguments

    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    parser.add_argument("--tap-log", required=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(parser.parse_args()))


if __name__ == "__main__":
    main()
