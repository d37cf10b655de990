"""The real-vLLM tier: one vLLM CPU server with two DP Ranks, started once per session, stopped by PID.

Where things come from:
- the vLLM virtualenv and the tiny model: ``scripts/vllm-cpu-env`` (run here if ``--print`` finds nothing);
  ``PROGROUTER_VLLM_PYTHON`` / ``PROGROUTER_VLLM_MODEL`` override both;
- ``PROGROUTER_VLLM_URL=http://127.0.0.1:PORT`` reuses a server you started yourself (same flags as below),
  which is how to iterate on one test without paying the start-up each time.

The session prints the time each stage took (environment, server start-up, each test) at the end.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from progrouter.server.runner import RunningRouter
from support.factories import RouterFactory

ROOT = Path(__file__).resolve().parents[2]
MODEL_NAME = "tiny-llama"
DP_SIZE = 2
BLOCK_SIZE = 32
NUM_BLOCKS = 512  # per Rank: 16,384 tokens of KV
KV_TOKENS_PER_RANK = BLOCK_SIZE * NUM_BLOCKS
MAX_MODEL_LEN = 8192
VOCAB_SIZE = 8192
HEALTH_TIMEOUT_SECONDS = 420.0  # a cold start on the shared 2-core machine has taken 265 s

STAGES: list[tuple[str, float]] = []
NOTES: list[str] = []


@dataclass(frozen=True)
class VllmServer:
    url: str
    model: str
    dp_size: int
    log: Path | None

    def log_tail(self, n: int = 40) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def _env_paths() -> tuple[str, str]:
    py, model = os.environ.get("PROGROUTER_VLLM_PYTHON"), os.environ.get("PROGROUTER_VLLM_MODEL")
    if py and model:
        return py, model
    script = ROOT / "scripts" / "vllm-cpu-env"
    probe = subprocess.run(["bash", str(script), "--print"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        built = subprocess.run(["bash", str(script)], text=True, check=False)
        if built.returncode != 0:
            pytest.fail("scripts/vllm-cpu-env failed: the vLLM CPU environment could not be built")
        probe = subprocess.run(["bash", str(script), "--print"], capture_output=True, text=True, check=True)
    values = dict(line.split("=", 1) for line in probe.stdout.split() if "=" in line)
    return values["PROGROUTER_VLLM_PYTHON"], values["PROGROUTER_VLLM_MODEL"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def vllm_command(
    python: str,
    model: str,
    port: int,
    *,
    dp_size: int = DP_SIZE,
    num_blocks: int = NUM_BLOCKS,
    max_model_len: int = MAX_MODEL_LEN,
    extra: tuple[str, ...] = (),
) -> list[str]:
    return [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model, "--served-model-name", MODEL_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--data-parallel-size", str(dp_size),
        "--block-size", str(BLOCK_SIZE), "--num-gpu-blocks-override", str(num_blocks),
        "--max-model-len", str(max_model_len),
        # On the CPU backend this is the share of host memory vLLM checks it may reserve; the KV size
        # itself comes from --num-gpu-blocks-override. 0.1 keeps the check passing on a shared machine.
        "--gpu-memory-utilization", "0.1",
        "--enable-prompt-tokens-details", "--enforce-eager", "--seed", "0",
        "--uvicorn-log-level", "warning",
        *extra,
    ]  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (its API server, DP coordinator and engine cores), then SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


@contextlib.contextmanager
def running_vllm(
    command: Callable[[str, str, int], list[str]], label: str, env: Mapping[str, str] | None = None
) -> Iterator[VllmServer]:
    """Start ``command(python, model, port)``, wait until healthy, yield it, stop its process group."""
    t0 = time.monotonic()
    python, model = _env_paths()
    STAGES.append(("vLLM environment (venv + tiny model)", time.monotonic() - t0))
    t1 = time.monotonic()
    port = _free_port()
    log = Path(tempfile.mkdtemp(prefix="progrouter-vllm-")) / "vllm.log"
    full_env = os.environ | {
        "VLLM_CPU_OMP_THREADS_BIND": "0|1",  # one core per DP Rank
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        **(env or {}),
    }
    cmd = command(python, model, port)
    dp_size = int(cmd[cmd.index("--data-parallel-size") + 1])
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )
    server = VllmServer(f"http://127.0.0.1:{port}", MODEL_NAME, dp_size, log)
    try:
        deadline = time.monotonic() + HEALTH_TIMEOUT_SECONDS
        while not _healthy(server.url):
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode} during start-up:\n{server.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM not healthy within {HEALTH_TIMEOUT_SECONDS:.0f} s:\n{server.log_tail()}")
            time.sleep(1.0)
        STAGES.append((f"{label} start-up (DP {dp_size}, pid {proc.pid})", time.monotonic() - t1))
        print(f"\nvLLM: {shlex.join(cmd)}\nlog: {log}", file=sys.stderr)
        yield server
    finally:
        t2 = time.monotonic()
        _stop(proc)
        STAGES.append((f"{label} shutdown", time.monotonic() - t2))


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    reuse = os.environ.get("PROGROUTER_VLLM_URL")
    if reuse:
        if not _healthy(reuse.rstrip("/")):
            pytest.fail(f"PROGROUTER_VLLM_URL={reuse} is not healthy")
        yield VllmServer(reuse.rstrip("/"), MODEL_NAME, DP_SIZE, None)
        return
    with running_vllm(vllm_command, "vLLM server") as server:
        yield server


@pytest.fixture
def make_router(make_router: RouterFactory, vllm_server: VllmServer) -> RouterFactory:
    """The root `make_router` in front of the session's vLLM server (two Ranks): `make_router(program)`."""

    async def make(program: dict[str, Any] | None = None, **overrides: Any) -> RunningRouter:
        fields = {"intra_node_data_parallel_size": vllm_server.dp_size, **overrides}
        return await make_router([vllm_server.url], program, **fields)

    return make


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and "tests/vllm/" in report.nodeid:
        STAGES.append((f"{report.nodeid.split('::')[-1]} ({report.outcome})", report.duration))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not STAGES:
        return
    terminalreporter.section("real-vLLM tier: stage times")
    for name, seconds in STAGES:
        terminalreporter.write_line(f"{seconds:8.1f} s  {name}")
    terminalreporter.write_line(f"{sum(s for _, s in STAGES):8.1f} s  total (stages above)")
    for note in NOTES:
        terminalreporter.write_line(note)
