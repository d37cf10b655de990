"""`progrouter serve` as a subprocess for tests: started on free ports, its URL read from its log line."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

Serve = Callable[..., Awaitable[tuple[asyncio.subprocess.Process, str]]]


@asynccontextmanager
async def serving() -> AsyncIterator[Serve]:
    """``await serve(*flags)`` inside: a subprocess and its URL; every one still running is killed after."""
    procs: list[asyncio.subprocess.Process] = []

    async def start(*flags: str) -> tuple[asyncio.subprocess.Process, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "progrouter", "serve", "--port", "0", "--prometheus-port", "off", *flags,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        procs.append(proc)
        assert proc.stderr is not None
        while True:
            line = (await asyncio.wait_for(proc.stderr.readline(), timeout=30)).decode()
            assert line, "serve exited before listening"
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                return proc, found.group(1)

    try:
        yield start
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
