"""Child processes of a benchmark: engines and routers started, health-waited and stopped by their own pid.

Each child gets its own session (so a terminal Ctrl-C reaches the benchmark, which then stops the children in
order) and its output goes to a log file in the report folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp


class ProcessError(RuntimeError):
    """A child process that did not come up; the message points at its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_ports_from(base: int, n: int) -> list[int]:
    """The first ``n`` free ports at or above ``base``: stable from run to run on an idle machine, so worker
    URLs — which consistent hashing hashes — and therefore placements are reproducible. A port is free when
    a server could listen on it now: the probe binds as the servers do (``SO_REUSEADDR``, asyncio's default),
    so a port the previous run left in TIME_WAIT counts as free, and a run started right after another
    hashes the same ring (without it, back-to-back demos moved to the next port and native's placement with
    it)."""
    ports: list[int] = []
    port = base
    while len(ports) < n:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
                ports.append(port)
            except OSError:
                pass
        port += 1
        if port > 65535:
            raise ProcessError(f"no {n} free ports above {base}")
    return ports


class Child:
    """One started process: ``Child.start(...)``, then ``wait_healthy(url)``, then ``stop()``."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.name = name
        self.proc = proc
        self.log = log

    @classmethod
    async def start(cls, name: str, argv: Sequence[str], log: Path) -> Child:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as f:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdout=f,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        return cls(name, proc, log)

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def wait_healthy(self, url: str, timeout: float = 60.0) -> None:
        """Poll ``url`` until it answers 200; fail early if the process exits."""
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
            while True:
                if self.proc.returncode is not None:
                    raise ProcessError(
                        f"{self.name} exited with {self.proc.returncode}; log {self.log}:\n{self.tail()}"
                    )
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(url) as resp:
                        if resp.status == 200:
                            return
                if time.monotonic() > deadline:
                    raise ProcessError(
                        f"{self.name} not healthy at {url} after {timeout:.0f} s; log {self.log}"
                    )
                await asyncio.sleep(0.2)

    async def stop(self, grace: float = 10.0) -> None:
        if self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()


async def stop_all(children: Sequence[Child]) -> None:
    await asyncio.gather(*(c.stop() for c in children))


async def run_shell(command: str, log: Path, timeout: float = 600.0) -> None:
    """Run a user's restart command (through the shell, as they wrote it); fail if it fails."""
    with open(log, "ab") as f:
        proc = await asyncio.create_subprocess_shell(command, stdout=f, stderr=asyncio.subprocess.STDOUT)
        try:
            rc = await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError as exc:
            proc.kill()
            raise ProcessError(f"restart command timed out after {timeout:.0f} s: {command}") from exc
    if rc != 0:
        raise ProcessError(f"restart command exited with {rc}: {command} (log {log})")
