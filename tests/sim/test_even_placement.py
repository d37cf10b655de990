"""bench/even_placement.py renames the sessions of a trace so that consistent hashing sends the k-th to Rank
k mod N: the native arm and the Program scheduler's default binding (the same key on a ring of the same
shape) then start every session on that Rank, and nothing but the names changes."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from types import ModuleType

import pytest

from progrouter.engine.profiles import with_cost_models
from progrouter.sim.arms import standard_arm
from progrouter.sim.simulation import Simulation
from progrouter.workload.trace import Trace, TraceProgram

from .bench_modules import bench_module
from .test_improvements import BLOCK, FLEET, PROFILE, agent

pytestmark = pytest.mark.timeout(120)

FOUR = replace(FLEET, ranks=4)


@pytest.fixture(scope="module")
def even() -> ModuleType:
    return bench_module("even_placement")


def with_subagent(trace: Trace) -> Trace:
    """The first task gets a subagent, so renaming has a parent to follow."""
    first = trace.tasks[0]
    lead = first.lead
    sub = TraceProgram(f"{first.task_id}:sub", "sub", lead.role, lead.requests[:1], lead.program_id,
                       spawn_after=0)  # fmt: skip
    return replace(trace, tasks=(replace(first, programs=(lead, sub)), *trace.tasks[1:]))


def first_ranks(trace: Trace, arm: str) -> list[int]:
    """The Rank of each task's first request, in trace order."""
    base = with_cost_models({}, PROFILE.prefill_cost_model, PROFILE.decode_throughput_model)
    facts = Simulation(trace, FOUR, standard_arm(arm, base)).run().facts
    first: dict[str, tuple[float, int]] = {}
    for f in facts:
        assert f.rank is not None
        if f.task_id not in first or f.started_at < first[f.task_id][0]:
            first[f.task_id] = (f.started_at, f.rank)
    return [first[t.task_id][1] for t in trace.tasks]


def test_every_arm_starts_the_kth_session_on_rank_k_mod_n(even: ModuleType) -> None:
    trace = Trace(BLOCK, tuple(agent(t, turns=2, gap=1.0, start_blocks=4) for t in range(8)), source="test")
    hashed = first_ranks(trace, "native")
    assert sorted(Counter(hashed).values()) != [2, 2, 2, 2]  # consistent hashing: uneven on these ids
    spread = even.spread(with_subagent(trace), 4)
    assert first_ranks(spread, "native") == [0, 1, 2, 3] * 2
    assert first_ranks(spread, "program") == [0, 1, 2, 3] * 2  # the spec's default binding agrees


def test_renaming_keeps_everything_but_the_names(even: ModuleType) -> None:
    trace = with_subagent(Trace(BLOCK, tuple(agent(t, 2, 1.0, start_blocks=4) for t in range(3)), source="t"))
    spread = even.spread(trace, 4)
    for old, new in zip(trace.tasks, spread.tasks, strict=True):
        assert new.task_id.startswith(f"{old.task_id}.") and new.start == old.start
        for p, q in zip(old.programs, new.programs, strict=True):
            assert q.program_id == f"{new.task_id}:{p.agent_id}" and q.requests is p.requests
            assert (q.parent_program_id is None) == (p.parent_program_id is None)
    sub = spread.tasks[0].programs[1]
    assert sub.parent_program_id == spread.tasks[0].lead.program_id
