"""`progrouter trace` in-process and `progrouter replay` as a subprocess (Ctrl-C keeps finished facts)."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import orjson
import pytest

from progrouter.cli import main
from progrouter.workload import trace as T
from progrouter.workload.facts import load_facts

from .fake_engine import FakeEngine, Seen, running
from .traces import tree_trace

pytestmark = pytest.mark.timeout(120)
DATA = Path(__file__).parent.parent / "data" / "workload"


def test_generate_import_and_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.jsonl"
    assert (
        main(
            [
                "trace",
                "generate",
                "coding",
                "--tasks",
                "3",
                "--seed",
                "5",
                "-o",
                str(out),
                "--token-scale",
                "0.5",
                "--time-scale",
                "2",
            ]
        )
        == 0
    )
    t = T.load(out)
    assert len(t.tasks) == 3 and t.block_size == 32 and t.meta["time_scale"] == 2.0
    capsys.readouterr()
    assert main(["trace", "stats", str(out), "--json"]) == 0
    figures = orjson.loads(capsys.readouterr().out)
    assert figures["intervals"] > 0 and figures["source"].startswith("trace")
    imported = tmp_path / "m.jsonl"
    assert (
        main(["trace", "import", "--format", "mooncake", str(DATA / "mooncake.jsonl"), "-o", str(imported)])
        == 0
    )
    assert len(T.load(imported).tasks) == 3
    assert main(["trace", "stats", str(DATA / "mooncake.jsonl")]) == 1  # not our format: a clear error


async def start_replay(url: str, trace: Path, out: Path, *extra: str) -> asyncio.subprocess.Process:
    """``python -m progrouter replay`` as a subprocess, as a user runs it."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "progrouter", "replay", "--url", url, "--trace", str(trace), "--out", str(out),
        *extra,
    )  # fmt: skip


async def test_replay_cli_and_stats_on_facts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace_path, facts_path = tmp_path / "t.jsonl", tmp_path / "f.jsonl"
    T.save(tree_trace(2), trace_path)
    async with running(FakeEngine()) as fake:
        proc = await start_replay(fake.url, trace_path, facts_path, "--quiet")
        assert await proc.wait() == 0
    facts = load_facts(facts_path)
    assert len(facts) == 12 and all(f.ok for f in facts)
    assert main(["trace", "stats", str(facts_path), "--json"]) == 0
    figures = orjson.loads(capsys.readouterr().out)
    assert figures["source"].startswith("replay facts") and figures["intervals"] == 6


async def test_ctrl_c_stops_cleanly_and_keeps_finished_facts(tmp_path: Path) -> None:
    trace_path, facts_path = tmp_path / "t.jsonl", tmp_path / "f.jsonl"
    T.save(tree_trace(1), trace_path)
    loop = asyncio.get_running_loop()
    in_flight = loop.create_future()
    never: asyncio.Future[None] = loop.create_future()

    def hold(s: Seen) -> asyncio.Future[None] | None:
        if s.program_id.endswith(":lead") and s.step == 1:
            if not in_flight.done():
                in_flight.set_result(None)
            return never
        return None

    async with running(FakeEngine(hold=hold)) as fake:
        proc = await start_replay(fake.url, trace_path, facts_path)
        await asyncio.wait_for(in_flight, 60)
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 60) == 130
        never.set_result(None)
    facts = {f.request_id: f for f in load_facts(facts_path)}
    assert facts["t0:lead:0"].ok and facts["t0:sub-b:0"].ok
    assert facts["t0:lead:1"].status == "cancelled"
    assert "t0:lead:2" not in facts
