"""agent-infer replay facts (`requests.jsonl`): one finished request per line.

Used fields: ``session_id``, ``actor_id``, ``actor_role``, ``started_at``, ``finished_at`` (ISO-8601 or
epoch seconds), ``input_tokens``, ``output_tokens``, ``cached_tokens``. A session is a task, an actor a
Program (the actor whose role is ``lead``, else the earliest, is the lead; the others are its subagents).

The facts carry no block ids, so the prompt structure is rebuilt: an actor's request reuses the whole
previous prompt of that actor when its input grew (the agent appended to its context), otherwise only the
``cached_tokens`` it reported; an actor's first request shares its ``cached_tokens`` with the lead's first
prompt (the system prompt), and the lead's first request shares them across sessions. Everything else is
private. Gaps are measured from the previous completion; a subagent is spawned after the last lead request
that finished before it started and blocks the lead when the lead's next request starts after it finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from progrouter.workload.importers._common import integer, jsonl_objects, timestamp
from progrouter.workload.trace import (
    AgentRole,
    Trace,
    TraceError,
    TraceProgram,
    TraceRequest,
    TraceTask,
    context_blocks,
    program_id,
)

DEFAULT_BLOCK_SIZE = 64
LEAD_ROLES = frozenset({"lead", "main", "root", "orchestrator"})
#: Block ids at or above this are private to a task; those below are the global shared prefix.
PRIVATE_BASE = 1 << 30


@dataclass(frozen=True, slots=True)
class _Fact:
    actor: str
    role: str
    started: float
    finished: float
    input_tokens: int
    output_tokens: int
    cached_tokens: int


def load_agent_infer(paths: Sequence[Path], block_size: int | None = None) -> Trace:
    size = block_size or DEFAULT_BLOCK_SIZE
    sessions: dict[str, list[_Fact]] = {}
    for where, obj in jsonl_objects(paths):
        sessions.setdefault(str(obj.get("session_id")), []).append(_fact(obj, where))
    if not sessions:
        raise TraceError("no requests found")
    t0 = min(f.started for facts in sessions.values() for f in facts)
    shared: set[int] = set()
    tasks = [_session(sid, facts, t0, size, shared) for sid, facts in sessions.items()]
    tasks.sort(key=lambda t: (t.start, t.task_id))
    return Trace(size, tuple(tasks), frozenset(shared), source="agent-infer", meta={})


def _fact(obj: dict[str, Any], where: str) -> _Fact:
    actor = obj.get("actor_id")
    return _Fact(
        actor="lead" if actor is None else str(actor),
        role=str(obj.get("actor_role") or ""),
        started=timestamp(obj.get("started_at"), where),
        finished=timestamp(obj.get("finished_at"), where),
        input_tokens=max(1, integer(obj, "input_tokens", where)),
        output_tokens=max(1, integer(obj, "output_tokens", where)),
        cached_tokens=max(0, integer(obj, "cached_tokens", where, 0) if obj.get("cached_tokens") else 0),
    )


def _session(sid: str, facts: list[_Fact], t0: float, size: int, shared: set[int]) -> TraceTask:
    by_actor: dict[str, list[_Fact]] = {}
    for f in sorted(facts, key=lambda f: f.started):
        by_actor.setdefault(f.actor, []).append(f)
    leads = [a for a, fs in by_actor.items() if fs[0].role.lower() in LEAD_ROLES]
    lead = leads[0] if leads else min(by_actor, key=lambda a: by_actor[a][0].started)
    lead_facts = by_actor[lead]
    next_id = [PRIVATE_BASE]

    def private(n: int) -> list[int]:
        ids = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        return ids

    lead_blocks: list[list[int]] = []
    programs: list[TraceProgram] = []
    start = lead_facts[0].started
    spawns = {a: _spawn(lead_facts, fs) for a, fs in by_actor.items() if a != lead}
    # A lead request after blocking subagents waited for them: its gap counts from their end.
    resumed = [f.finished for f in lead_facts]
    for a, (after, blocking) in spawns.items():
        if blocking and after >= 0:
            resumed[after] = max(resumed[after], by_actor[a][-1].finished)
    for actor in [lead, *(a for a in by_actor if a != lead)]:
        fs = by_actor[actor]
        is_lead = actor == lead
        blocks: list[list[int]] = []
        requests: list[TraceRequest] = []
        spawn_after, blocks_parent = (None, False) if is_lead else spawns[actor]
        for i, f in enumerate(fs):
            need = context_blocks(f.input_tokens, size)
            if i > 0:
                prev = fs[i - 1]
                reuse_tokens = prev.input_tokens if f.input_tokens >= prev.input_tokens else f.cached_tokens
                prefix = blocks[-1][: min(reuse_tokens // size, need)]
                gap = max(0.0, f.started - (resumed[i - 1] if is_lead else prev.finished))
            else:
                reuse = min(f.cached_tokens // size, need)
                if is_lead:
                    prefix = list(range(reuse))
                    shared.update(prefix)
                else:
                    prefix = lead_blocks[0][:reuse]
                if is_lead:
                    gap = 0.0
                elif spawn_after is None or spawn_after < 0:
                    gap = max(0.0, f.started - start)
                else:
                    gap = max(0.0, f.started - lead_facts[spawn_after].finished)
            ids = prefix + private(need - len(prefix))
            blocks.append(ids)
            requests.append(TraceRequest(f.input_tokens, tuple(ids), f.output_tokens, gap))
        if is_lead:
            lead_blocks = blocks
        programs.append(
            TraceProgram(
                program_id=program_id(sid, actor),
                agent_id=actor,
                role=AgentRole.LEAD if is_lead else AgentRole.SUBAGENT,
                requests=tuple(requests),
                parent_program_id=None if is_lead else program_id(sid, lead),
                blocks_parent=blocks_parent,
                spawn_after=spawn_after,
            )
        )
    return TraceTask(sid, start - t0, tuple(programs))


def _spawn(lead_facts: list[_Fact], fs: list[_Fact]) -> tuple[int, bool]:
    """(spawn_after, blocks_parent) of a subagent whose requests are ``fs``."""
    after = max((i for i, lf in enumerate(lead_facts) if lf.finished <= fs[0].started), default=-1)
    following = lead_facts[after + 1] if after + 1 < len(lead_facts) else None
    return after, following is not None and following.started >= fs[-1].finished
