"""The getting-started commands work as written: the emulator and the router start from the page's own
blocks, and each marked command against them exits 0 and prints what the page promises."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from docs.runnable import DOCS, Block, blocks, free_port, marked_pages, ports_of, runnable

QUICKSTART = DOCS / "getting-started" / "quickstart.md"
READY_TIMEOUT = 60.0


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _wait_healthy(port: int, servers: list[subprocess.Popen[str]]) -> None:
    """Poll ``/health`` on ``port`` until it answers 200; fail with the servers' output if one exits."""
    deadline = time.monotonic() + READY_TIMEOUT
    while not _healthy(port):
        dead = [s for s in servers if s.poll() is not None]
        if dead or time.monotonic() > deadline:
            output = "\n".join(s.communicate(timeout=5)[0] for s in dead)
            pytest.fail(f"port {port} never became healthy:\n{output}")
        time.sleep(0.2)


@pytest.fixture
def env() -> dict[str, str]:
    """The reader's environment, plus a free metrics port (the pages leave the default 29000)."""
    return {**os.environ, "PROGROUTER_PROMETHEUS_PORT": "0"}


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen[str]]]:
    """The background blocks' processes; each is stopped (its whole process group) after the test."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in started:
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def _start(block: Block, ports: dict[int, int], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["bash", "-c", "exec " + runnable(block.body, ports).replace("\\\n", " ")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )


@pytest.mark.parametrize("page", marked_pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_marked_blocks_run_against_the_emulator(
    page: Path, env: dict[str, str], servers: list[subprocess.Popen[str]]
) -> None:
    """Start the page's background blocks in order, each healthy before the next, then run every ``run``
    block: it must exit 0 and print its ``expect`` text."""
    marked = blocks(page)
    ports = {port: free_port() for port in ports_of(marked)}
    ran = 0
    for block in marked:
        assert block.lang == "bash", f"{page}:{block.line}: a runnable block must be a bash fence"
        if block.kind == "background":
            servers.append(_start(block, ports, env))
            for port in ports_of([block]):
                _wait_healthy(ports[port], servers)
            continue
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", runnable(block.body, ports)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        where = f"{page.name}:{block.line}"
        assert done.returncode == 0, f"{where} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        assert block.expect is None or block.expect in done.stdout, f"{where} printed:\n{done.stdout}"
        ran += 1
    assert ran > 0, f"{page}: no run block after its servers"


def test_the_quickstart_marks_its_commands() -> None:
    """The quickstart's hand-run commands stay under test: two servers, then the chat request and the
    diagnostics, each with what it must print."""
    marked = blocks(QUICKSTART)
    assert [b.kind for b in marked[:2]] == ["background", "background"]
    bodies = " ".join(b.body for b in marked if b.kind == "run")
    assert "/v1/chat/completions" in bodies and "/scheduling/diagnostics" in bodies
    assert all(b.expect for b in marked if b.kind == "run")


def test_a_marker_without_a_block_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- docs-test: run -->\nno fence here\n")
    with pytest.raises(ValueError, match="not directly followed"):
        blocks(page)


def test_ports_are_replaced_and_the_command_is_this_interpreter() -> None:
    block = "progrouter serve --worker-urls http://127.0.0.1:8000 --port 3001\ncurl http://127.0.0.1:3001/x"
    text = runnable(block, {8000: 18000, 3001: 13001})
    assert "127.0.0.1:18000" in text and "--port 13001" in text and "127.0.0.1:13001/x" in text
    assert " -m progrouter serve " in text and "8000 " not in text.replace("18000", "")
