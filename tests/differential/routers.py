"""Start progrouter or the upstream ``vllm-router`` wheel as a subprocess with the same flags, and stop it.

Both get a free loopback port and Prometheus port; each writes its output to a log file whose tail is shown
when it fails to start, so a red test says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_VENV = ROOT / ".venv-upstream"
UPSTREAM_BIN = UPSTREAM_VENV / "bin" / "vllm-router"
UPSTREAM_LAUNCHER = Path(__file__).with_name("upstream_launcher.py")
ROUTERS = ("upstream", "progrouter")
START_DEADLINE_S = 30.0


def upstream_bin() -> Path:
    """The wheel's launcher; its absence is a setup error (``make upstream``), never a skip."""
    if not UPSTREAM_BIN.exists():
        raise RuntimeError(
            f"{UPSTREAM_BIN} is missing: run `make upstream` "
            f"(it installs vllm-router==0.1.17 into {UPSTREAM_VENV})"
        )
    return UPSTREAM_BIN


def command(kind: str) -> list[str]:
    """The command line that starts router ``kind`` ("upstream" or "progrouter"), before its flags."""
    if kind == "upstream":
        return [str(upstream_bin().with_name("python")), str(UPSTREAM_LAUNCHER)]
    return [sys.executable, "-m", "progrouter", "serve"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class StartupError(RuntimeError):
    """A router exited or never became ready; ``output`` is what it printed."""

    def __init__(self, router: RouterProcess, reason: str) -> None:
        self.output = router.log_tail()
        super().__init__(f"{router.kind} {reason}\n$ {' '.join(router.argv)}\n{self.output}")


@dataclass
class RouterProcess:
    kind: str
    argv: list[str]
    process: asyncio.subprocess.Process
    url: str
    metrics_url: str
    log: Path

    def log_tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 10.0)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


PORT_TAKEN = ("address already in use", "addrinuse", "errno 98")
PORT_ATTEMPTS = 3


async def start_router(
    kind: str, flags: list[str], log_dir: Path, ready_path: str = "/readiness"
) -> RouterProcess:
    """Start ``kind`` with ``flags`` (plus host and ports) and wait until ``ready_path`` answers 200.

    A free port can be taken by a parallel test between our probe and the router's bind; a start that
    failed for that reason alone is retried on fresh ports (any other failure is raised as it is).
    """
    for _ in range(PORT_ATTEMPTS - 1):
        try:
            return await _start_once(kind, flags, log_dir, ready_path)
        except StartupError as exc:
            if not any(marker in exc.output.lower() for marker in PORT_TAKEN):
                raise
    return await _start_once(kind, flags, log_dir, ready_path)


async def _start_once(kind: str, flags: list[str], log_dir: Path, ready_path: str) -> RouterProcess:
    port, metrics_port = free_port(), free_port()
    argv = [
        *command(kind),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(metrics_port),
        *flags,
    ]
    log = log_dir / f"{kind}-{port}.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out)
    router = RouterProcess(
        kind, argv, process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics", log
    )
    try:
        await _wait_ready(router, ready_path)
    except BaseException:
        await router.stop()
        raise
    return router


async def _wait_ready(router: RouterProcess, path: str) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
        while time.monotonic() < deadline:
            if router.process.returncode is not None:
                raise StartupError(router, f"exited with {router.process.returncode} at startup")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(router.url + path) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.05)
    raise StartupError(router, f"not ready on {path} after {START_DEADLINE_S}s")
