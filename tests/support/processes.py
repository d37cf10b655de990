"""Emulator and router subprocesses a fault test can kill, restart on the same port, or send SIGTERM.

An engine runs ``tapped_engine.py`` (the real emulator plus the arrival tap); a router runs
``progrouter serve``. Both are started with ``asyncio`` subprocesses and always reaped by ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from support.tapped_engine import READY

TAPPED_ENGINE = Path(__file__).with_name("tapped_engine.py")
_ROUTER_URL = re.compile(r"progrouter listening on (http://\S+)")


async def _wait_for_line(
    stream: asyncio.StreamReader, pattern: re.Pattern[str], timeout: float
) -> re.Match[str]:
    """Read lines until one matches; fail with what was read after ``timeout`` seconds."""
    seen: list[str] = []

    async def scan() -> re.Match[str]:
        while line := await stream.readline():
            text = line.decode(errors="replace")
            seen.append(text)
            if match := pattern.search(text):
                return match
        raise RuntimeError("process exited before it was ready:\n" + "".join(seen))

    try:
        return await asyncio.wait_for(scan(), timeout)
    except TimeoutError:
        raise RuntimeError(f"process not ready within {timeout} s:\n" + "".join(seen)) from None


async def _drain(stream: asyncio.StreamReader, sink: list[str]) -> None:
    while line := await stream.readline():
        sink.append(line.decode(errors="replace"))


class _Child:
    """One subprocess whose output is kept (a full pipe would block it)."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.output: list[str] = []
        self._drainer: asyncio.Task[None] | None = None

    async def _spawn(self, argv: list[str], ready: re.Pattern[str], timeout: float = 30.0) -> re.Match[str]:
        self.proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        assert self.proc.stdout is not None
        try:
            match = await _wait_for_line(self.proc.stdout, ready, timeout)
        except BaseException:
            await self.stop()
            raise
        self._drainer = asyncio.create_task(_drain(self.proc.stdout, self.output))
        return match

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def signal(self, sig: signal.Signals) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(sig)

    async def wait(self, timeout: float) -> int:
        """The exit code; fails if the process is still running after ``timeout`` seconds."""
        assert self.proc is not None
        code = await asyncio.wait_for(self.proc.wait(), timeout)
        if self._drainer is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drainer, 5.0)
        return code

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; always reaps."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10.0)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._drainer is not None:
            self._drainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drainer


class EngineProcess(_Child):
    """``tapped_engine.py`` with fixed flags; ``kill`` is SIGKILL, ``restart`` reuses the port."""

    def __init__(self, flags: list[str], tap_log: Path) -> None:
        super().__init__()
        self.flags = flags
        self.tap_log = tap_log
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> EngineProcess:
        argv = [sys.executable, str(TAPPED_ENGINE), *self.flags, "--port", str(self.port)]
        argv += ["--tap-log", str(self.tap_log), "--log-level", "warning"]
        match = await self._spawn(argv, re.compile(READY + r" (\d+)"))
        self.port = int(match.group(1))
        return self

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        await self.wait(10.0)

    async def restart(self) -> None:
        """Start again on the same port (the tap log continues)."""
        await self.start()


class RouterProcess(_Child):
    """``progrouter serve`` on a free port (its Prometheus listener on another) with Program scheduling."""

    def __init__(self, worker_urls: list[str], program: dict[str, Any], **flags: Any) -> None:
        super().__init__()
        self.argv = [sys.executable, "-m", "progrouter", "serve", "--worker-urls", *worker_urls]
        self.argv += ["--port", "0", "--prometheus-port", "0", "--enable-program-scheduling"]
        self.argv += ["--program-scheduling-config-json", json.dumps(program)]
        for name, value in flags.items():
            self.argv += ["--" + name.replace("_", "-"), str(value)]
        self.url = ""

    async def start(self) -> RouterProcess:
        """Start it; wait (30 s at most) for ``/readiness`` 200: it listens before its workers answer."""
        self.url = (await self._spawn(self.argv, _ROUTER_URL)).group(1)
        deadline = time.monotonic() + 30.0
        async with aiohttp.ClientSession() as session:
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(self.url + "/readiness") as r:
                        if r.status == 200:
                            return self
                if time.monotonic() > deadline:
                    await self.stop()
                    raise RuntimeError("router not ready within 30 s:\n" + "".join(self.output))
                await asyncio.sleep(0.05)
