"""Start `progrouter engine` emulators as subprocesses (port 0), stopped by PID when the test is done."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

EngineFactory = Callable[..., str]


@pytest.fixture
def engine() -> Iterator[EngineFactory]:
    """``engine("--fail-rate", "1")`` starts an emulator with those flags and returns its base URL."""
    procs: list[subprocess.Popen[str]] = []

    def start(*flags: str) -> str:
        proc = subprocess.Popen(
            [sys.executable, "-m", "progrouter", "engine", "--port", "0", "--log-level", "warning", *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        procs.append(proc)
        deadline = time.monotonic() + 30
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            match = re.search(r" on (http://\S+) ", line)
            if match:
                return match.group(1)
        raise AssertionError(f"emulator did not start (exit {proc.poll()})")

    yield start
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
