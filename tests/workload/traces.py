"""Small hand-built traces for replay tests."""

from __future__ import annotations

from progrouter.workload.trace import AgentRole, Trace, TraceProgram, TraceRequest, TraceTask


def req(blocks: list[int], out: int = 3, gap: float = 0.0, block_size: int = 16) -> TraceRequest:
    return TraceRequest(len(blocks) * block_size, tuple(blocks), out, gap)


def tree_task(task_id: str, *, sub_gap: float = 0.0) -> TraceTask:
    """A lead of 3 requests; after its first, a blocking subagent (2 requests) and a non-blocking one (1)."""
    lead = TraceProgram(
        f"{task_id}:lead",
        "lead",
        AgentRole.LEAD,
        (req([0, 1, 10]), req([0, 1, 10, 11], gap=0.02), req([0, 1, 10, 11, 12], gap=0.01)),
    )
    blocking = TraceProgram(
        f"{task_id}:sub-b",
        "sub-b",
        AgentRole.SUBAGENT,
        (req([0, 1, 20], gap=0.01), req([0, 1, 20, 21], gap=0.02)),
        parent_program_id=lead.program_id,
        blocks_parent=True,
        spawn_after=0,
    )
    free = TraceProgram(
        f"{task_id}:sub-f",
        "sub-f",
        AgentRole.SUBAGENT,
        (req([0, 1, 30], gap=sub_gap),),
        parent_program_id=lead.program_id,
        blocks_parent=False,
        spawn_after=0,
    )
    return TraceTask(task_id, 0.0, (lead, blocking, free))


def tree_trace(n_tasks: int = 2) -> Trace:
    return Trace(16, tuple(tree_task(f"t{i}") for i in range(n_tasks)), frozenset({0, 1}), source="test")
