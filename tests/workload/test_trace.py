"""The trace model: JSONL round trip, validation, scaling, generator determinism."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import pytest

from progrouter.config import PrefillCostModel
from progrouter.workload import trace as T
from progrouter.workload.generators import CodingWorkload, generate, long_tool_workload
from progrouter.workload.stats import summarize, trace_intervals


def small(**kw: object) -> CodingWorkload:
    base: dict[str, object] = {"tasks": 4, "turns_min": 4, "turns_max": 8, "subagent_spawn_prob": 0.3}
    base.update(kw)
    return CodingWorkload(**base)  # type: ignore[arg-type]


def dump(trace: T.Trace) -> bytes:
    f = io.BytesIO()
    T.write(trace, f)
    return f.getvalue()


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    assert dump(generate(small(seed=7))) == dump(generate(small(seed=7)))
    assert dump(generate(small(seed=7))) != dump(generate(small(seed=8)))


def test_round_trip(tmp_path: Path) -> None:
    t = generate(small())
    T.save(t, tmp_path / "t.jsonl")
    assert T.load(tmp_path / "t.jsonl") == t


def test_coding_workload_shape() -> None:
    t = generate(small(tasks=6, subagent_spawn_prob=0.5))
    assert t.shared_hash_ids  # the system prompt is shared by every task
    sys_blocks = len(t.shared_hash_ids)
    subagents = 0
    for task in t.tasks:
        for p in task.programs:
            reqs = p.requests
            assert set(reqs[0].hash_ids[:sys_blocks]) == t.shared_hash_ids
            for prev, cur in itertools.pairwise(reqs):
                assert cur.hash_ids[: len(prev.hash_ids)] == prev.hash_ids  # context grows by appending
                assert cur.input_tokens > prev.input_tokens
                assert cur.input_tokens == len(cur.hash_ids) * t.block_size
            if p.parent_program_id is not None:
                subagents += 1
                assert p.blocks_parent and p.spawn_after is not None
    assert subagents > 0


def test_gap_mix_short_majority_long_tail() -> None:
    t = generate(CodingWorkload(tasks=30, seed=3))
    gaps = [r.gap for _t, p in t.programs() for r in p.requests[1:]]
    short = sum(g < 2.0 for g in gaps) / len(gaps)
    long = sum(g > 10.0 for g in gaps) / len(gaps)
    assert short > 0.6 and 0.01 < long < 0.2
    figures = summarize(trace_intervals(t, PrefillCostModel()))
    assert figures["share_below_impact"] > 0.5


def test_long_tool_workload_has_no_reuse_opportunity() -> None:
    t = generate(long_tool_workload(tasks=6))
    figures = summarize(trace_intervals(t, PrefillCostModel()))
    assert figures["share_below_impact"] < 0.05
    assert "non-regression" in figures["verdict"]


def test_scaling_is_consistent() -> None:
    t = generate(small())
    s = t.scaled(token_scale=0.5, time_scale=2.0)
    assert s.block_size == t.block_size // 2
    for (_a, p), (_b, q) in zip(t.programs(), s.programs(), strict=True):
        for r, x in zip(p.requests, q.requests, strict=True):
            assert x.hash_ids == r.hash_ids
            assert x.input_tokens == round(r.input_tokens * 0.5)
            assert x.gap == pytest.approx(2.0 * r.gap)
    assert s.meta["token_scale"] == 0.5 and s.meta["time_scale"] == 2.0


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["programs"][1].update(parent_program_id="nope"), "not in the task"),
        (lambda d: d["programs"][1].update(spawn_after=99), "spawn_after"),
        (lambda d: d["programs"][0].update(parent_program_id="t:sub"), "exactly one Program"),
        (lambda d: d["programs"][0]["requests"][0].update(out=0), "must be > 0"),
        (lambda d: d["programs"][0]["requests"][0].update(gap=-1), "gap"),
    ],
)
def test_validation_names_the_problem(edit: object, message: str) -> None:
    import orjson

    task = {
        "type": "task",
        "task_id": "t",
        "start": 0,
        "programs": [
            {
                "program_id": "t:lead",
                "agent_id": "lead",
                "role": "lead",
                "requests": [{"in": 4, "hash_ids": [1], "out": 1, "gap": 0}],
            },
            {
                "program_id": "t:sub",
                "agent_id": "sub",
                "role": "subagent",
                "parent_program_id": "t:lead",
                "blocks_parent": True,
                "spawn_after": 0,
                "requests": [{"in": 4, "hash_ids": [2], "out": 1, "gap": 0}],
            },
        ],
    }
    header = {"type": "header", "format": "progrouter-trace", "version": 1, "block_size": 4}
    assert T.parse_lines([orjson.dumps(header), orjson.dumps(task)]).tasks[0].num_requests == 2
    edit(task)  # type: ignore[operator]
    with pytest.raises(T.TraceError, match=message):
        T.parse_lines([orjson.dumps(header), orjson.dumps(task)])


def test_rejects_other_formats_and_versions() -> None:
    with pytest.raises(T.TraceError, match="not a progrouter-trace header"):
        T.parse_lines([b'{"timestamp": 0}'])
    with pytest.raises(T.TraceError, match="unsupported"):
        T.parse_lines([b'{"type": "header", "format": "progrouter-trace", "version": 99, "block_size": 4}'])
