"""Hand-built traces small enough to check by hand (block size 16 everywhere)."""

from __future__ import annotations

from progrouter.workload.trace import AgentRole, Trace, TraceProgram, TraceRequest, TraceTask

BS = 16


def req(blocks: list[int], out: int = 8, gap: float = 0.0) -> TraceRequest:
    return TraceRequest(len(blocks) * BS, tuple(blocks), out, gap)


def lead(task_id: str, *requests: TraceRequest) -> TraceProgram:
    return TraceProgram(f"{task_id}:lead", "lead", AgentRole.LEAD, tuple(requests))


def sub(task_id: str, name: str, *requests: TraceRequest, blocks: bool, after: int) -> TraceProgram:
    return TraceProgram(
        f"{task_id}:{name}",
        name,
        AgentRole.SUBAGENT,
        tuple(requests),
        parent_program_id=f"{task_id}:lead",
        blocks_parent=blocks,
        spawn_after=after,
    )


def trace(*tasks: TraceTask) -> Trace:
    return Trace(BS, tuple(tasks), source="test")
