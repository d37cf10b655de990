"""What the loopback benchmarks share: a free port, a process tree's CPU time, waiting for a URL to answer,
background CPU load."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path

import aiohttp
from aiohttp import web


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loadavg() -> str:
    """The machine's load as ``/proc/loadavg`` says it, printed beside every figure of a shared machine."""
    return Path("/proc/loadavg").read_text().strip()


def stop(routers: Iterable[subprocess.Popen[bytes]], worker: subprocess.Popen[bytes]) -> None:
    """End a bench's routers, then the loopback worker behind them."""
    for proc in routers:
        proc.terminate()
        proc.wait(timeout=60)
    worker.terminate()
    worker.wait(timeout=30)


def tree_cpu(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid`` and its live descendants (upstream's launcher may fork)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        stats[int(entry)] = (int(fields[1]), int(fields[11]) / tick, int(fields[12]) / tick)
    user = system = 0.0
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        _, u, s = stats.get(current, (0, 0.0, 0.0))
        user, system = user + u, system + s
        frontier.extend(child for child, (parent, _, _) in stats.items() if parent == current)
    return user, system


async def wait_ready(session: aiohttp.ClientSession, url: str) -> None:
    """Poll ``url`` until it answers 200 (60 s at most)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            async with session.get(url) as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up")
        await asyncio.sleep(0.05)


# A burner spins in pure Python until its parent is gone or ``limit`` seconds have passed, whichever is first:
# a bench that dies leaves no CPU hog behind.
_BURN = """
import os, sys, time
parent, end = os.getppid(), time.monotonic() + float(sys.argv[1])
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(200_000):
        pass
"""


@contextlib.contextmanager
def cpu_burners(count: int, limit: float = 3600.0) -> Iterator[None]:
    """``count`` processes burning CPU (one core each) for the block: background load, bounded in time."""
    procs = [subprocess.Popen([sys.executable, "-c", _BURN, str(limit)]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def run_worker(port: int, chat: Handler) -> None:
    """A loopback worker on uvloop: ``chat`` answers ``/v1/chat/completions``; ``/health`` and ``/v1/models``
    answer ok (the routers' readiness and health checks)."""
    import uvloop

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", health)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)
