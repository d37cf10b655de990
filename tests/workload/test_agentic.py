"""The Claude-Code-shaped generator: its trace's shape matches the measured sessions, it is reproducible, the
context cap compacts, and `progrouter trace generate agentic` / `trace stats` show it."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from progrouter.workload import trace as trace_mod
from progrouter.workload.agentic import AgenticWorkload, generate_agentic
from progrouter.workload.stats import trace_shape

#: (figure, quantile, target from the 200 measured sessions, relative tolerance). Per-request input and turns
#: are heavy-tailed session-level draws, so they get the widest band; 400 sessions are drawn.
TARGETS = [
    ("input_tokens", "p10", 50_000, 0.15), ("input_tokens", "p50", 114_000, 0.15),
    ("input_tokens", "p90", 306_000, 0.15), ("growth_tokens", "p50", 876, 0.10),
    ("growth_tokens", "p90", 4_577, 0.10), ("output_tokens", "p50", 237, 0.10),
    ("output_tokens", "p90", 862, 0.10), ("turns_per_session", "p50", 25, 0.20),
    ("turns_per_session", "p90", 104, 0.20), ("gap_seconds", "p10", 5, 0.10), ("gap_seconds", "p25", 7, 0.10),
    ("gap_seconds", "p50", 13, 0.10), ("gap_seconds", "p75", 45, 0.10), ("gap_seconds", "p90", 187, 0.20),
    ("gap_seconds", "p99", 2_462, 0.25),
]  # fmt: skip


@pytest.fixture(scope="module")
def shape() -> dict[str, object]:
    return trace_shape(generate_agentic(AgenticWorkload(tasks=400, seed=0)))


@pytest.mark.parametrize(("figure", "quantile", "target", "tolerance"), TARGETS)
def test_shape_matches_the_measured_sessions(
    shape: dict[str, dict[str, float]], figure: str, quantile: str, target: float, tolerance: float
) -> None:
    assert shape[figure][quantile] == pytest.approx(target, rel=tolerance)


def test_gap_shares_and_subagents_match(shape: dict[str, float]) -> None:
    assert shape["gap_share_within_1s"] == pytest.approx(0.009, abs=0.005)
    assert shape["gap_share_within_10s"] == pytest.approx(0.426, abs=0.03)
    assert shape["subagent_session_share"] == pytest.approx(0.05, abs=0.025)


def test_seeded_and_reproducible() -> None:
    w = AgenticWorkload(tasks=12, seed=3)
    first = b"".join(trace_mod.dump_lines(generate_agentic(w)))
    assert first == b"".join(trace_mod.dump_lines(generate_agentic(w)))
    assert first != b"".join(trace_mod.dump_lines(generate_agentic(replace(w, seed=4))))


def test_each_request_extends_the_previous_prefix() -> None:
    t = generate_agentic(AgenticWorkload(tasks=20, seed=1))
    bs = t.block_size
    for _task, p in t.programs():
        for prev, cur in zip(p.requests, p.requests[1:], strict=False):
            assert len(cur.hash_ids) == cur.input_tokens // bs
            if cur.input_tokens >= prev.input_tokens:  # not a compaction: the old full blocks are kept
                assert cur.hash_ids[: len(prev.hash_ids)] == prev.hash_ids
    first = [p.requests[0].hash_ids[:10] for _t, p in t.programs()]
    assert all(f == first[0] for f in first)  # the system prompt is shared by every session


def test_the_cap_compacts_and_keeps_the_turns() -> None:
    w = AgenticWorkload(tasks=40, seed=2)
    capped = generate_agentic(replace(w, max_context_tokens=100_000))
    free = generate_agentic(w)
    assert max(r.input_tokens for _t, p in capped.programs() for r in p.requests) <= 100_000
    assert [len(t.lead.requests) for t in capped.tasks] == [len(t.lead.requests) for t in free.tasks]
    drops = sum(
        cur.input_tokens < prev.input_tokens
        for _t, p in capped.programs()
        for prev, cur in zip(p.requests, p.requests[1:], strict=False)
    )
    assert drops > 0
    with pytest.raises(ValueError, match="max_context_tokens"):
        generate_agentic(replace(w, max_context_tokens=1000))


def test_cli_generates_and_stats_shows_the_shape(tmp_path: Path) -> None:
    out = tmp_path / "agentic.jsonl"
    cmd = [sys.executable, "-m", "progrouter", "trace"]
    done = subprocess.run(
        [*cmd, "generate", "agentic", "--tasks", "30", "--seed", "5", "--max-context-tokens", "200000",
         "--block-size", "256", "-o", str(out)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    t = trace_mod.load(out)
    assert t.block_size == 256 and len(t.tasks) == 30 and t.meta["generator"] == "agentic"
    stats = subprocess.run(
        [*cmd, "stats", str(out), "--json"], capture_output=True, timeout=60, check=False
    )  # fmt: skip
    assert stats.returncode == 0, stats.stderr
    shape = orjson.loads(stats.stdout)["shape"]
    assert shape["sessions"] == 30 and shape["requests"] == t.num_requests
    assert shape["input_tokens"]["p90"] <= 200_000
