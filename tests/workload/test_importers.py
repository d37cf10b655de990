"""Importers on small hand-written fixtures (tests/data/workload)."""

from __future__ import annotations

from pathlib import Path

import pytest

from progrouter.workload.importers import load_agent_infer, load_kv_cache_tester, load_mooncake
from progrouter.workload.trace import AgentRole, TraceError

DATA = Path(__file__).parent.parent / "data" / "workload"


def test_kv_cache_tester_session_with_subagents() -> None:
    trace = load_kv_cache_tester(
        [DATA / "kv_cache_tester_session_a.json", DATA / "kv_cache_tester_session_b.json"]
    )
    assert trace.block_size == 64
    assert [t.task_id for t in trace.tasks] == ["sess-a", "sess-b"]
    a = trace.tasks[0]
    lead = a.lead
    assert lead.program_id == "sess-a:lead" and lead.role is AgentRole.LEAD
    assert [r.input_tokens for r in lead.requests] == [200, 300, 400]
    assert [r.gap for r in lead.requests] == [0.0, 0.5, 4.4]
    assert lead.requests[1].hash_ids == (1, 2, 3, 4, 5)
    subs = {p.agent_id: p for p in a.children("sess-a:lead")}
    assert set(subs) == {"explore-1", "bg-1"}
    explore, bg = subs["explore-1"], subs["bg-1"]
    # explore ends at 7.1 s, before the lead's next request at 7.5 s: it blocks; bg runs 20 s: it does not.
    assert explore.blocks_parent and not bg.blocks_parent
    assert explore.spawn_after == 1 and bg.spawn_after == 1
    assert explore.spawn_reason == "Explore" and explore.role is AgentRole.SUBAGENT
    assert [r.gap for r in explore.requests] == [0.0, 0.5]
    assert explore.parent_program_id == "sess-a:lead"
    # Blocks 1 and 2 occur in both sessions: global; 90 only in sess-a: task-scoped.
    assert trace.shared_hash_ids == frozenset({1, 2})


def test_kv_cache_tester_rejects_unknown_entry(tmp_path: Path) -> None:
    bad = tmp_path / "s.json"
    bad.write_text('{"id": "x", "block_size": 64, "requests": [{"type": "weird", "t": 0}]}')
    with pytest.raises(TraceError, match="unknown entry type"):
        load_kv_cache_tester([bad])


def test_mooncake_sessions_and_single_requests() -> None:
    trace = load_mooncake([DATA / "mooncake.jsonl"])
    assert trace.block_size == 512
    assert [(t.task_id, t.start) for t in trace.tasks] == [("s-s1", 0.0), ("r-1", 0.5), ("s-s2", 1.0)]
    s1 = trace.tasks[0].lead
    assert [r.gap for r in s1.requests] == [0.0, 2.0]
    assert [r.input_tokens for r in s1.requests] == [1024, 1500]
    assert s1.requests[1].hash_ids == (0, 1, 2)
    assert trace.shared_hash_ids == frozenset({0})


def test_agent_infer_rebuilds_programs_and_prefixes() -> None:
    trace = load_agent_infer([DATA / "agent_infer_requests.jsonl"])
    assert trace.block_size == 64
    a, b = trace.tasks
    assert (a.task_id, a.start, b.task_id, b.start) == ("A", 0.0, "B", 1.0)
    lead = a.lead
    assert [r.gap for r in lead.requests] == pytest.approx([0.0, 0.5, 0.3])
    r0, r1, _r2 = lead.requests
    assert len(r0.hash_ids) == 16  # ceil(1000 / 64)
    assert r1.hash_ids[:15] == r0.hash_ids[:15]  # grew from 1000 to 1200: reuses the whole previous prompt
    assert r1.hash_ids[15] != r0.hash_ids[15]
    (worker,) = a.children("A:lead")
    assert worker.agent_id == "worker-1" and worker.spawn_after == 1 and worker.blocks_parent
    assert worker.requests[0].gap == pytest.approx(0.2)
    assert worker.requests[0].hash_ids[:4] == r0.hash_ids[:4]  # 256 cached tokens = the lead's first 4 blocks
    assert worker.requests[0].hash_ids[4] not in r0.hash_ids
    # B's first request had 128 cached tokens: 2 blocks of the cross-session shared prefix.
    assert b.lead.requests[0].hash_ids[:2] == (0, 1)
    assert trace.shared_hash_ids == frozenset({0, 1})


@pytest.mark.parametrize("load", [load_mooncake, load_agent_infer])
def test_jsonl_importers_name_the_malformed_line(load: object, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n{not json\n")
    with pytest.raises(TraceError, match=r"bad\.jsonl:2: malformed JSON"):
        load([bad])  # type: ignore[operator]
    bad.write_text("[1, 2]\n")
    with pytest.raises(TraceError, match=r"bad\.jsonl:1: expected an object"):
        load([bad])  # type: ignore[operator]
