"""The ``vllm_xargs.agentic_context`` a replayed request carries: the Program identity the router reads.
Shared by the live replay and the simulator."""

from __future__ import annotations

from typing import Any

import orjson

from progrouter.workload.trace import TraceProgram, TraceTask


def agentic_context(
    task: TraceTask,
    program: TraceProgram,
    step: int,
    request_id: str,
    kv_retention_ttl_seconds: float | None = None,
) -> str:
    ctx: dict[str, Any] = {
        "program_id": program.program_id,
        "task_id": task.task_id,
        "agent_id": program.agent_id,
        "agent_role": program.role.value,
        "step_id": step,
        "request_id": request_id,
        "blocks_parent": program.blocks_parent,
    }
    if program.parent_program_id is not None:
        ctx["parent_program_id"] = program.parent_program_id
    if kv_retention_ttl_seconds is not None:  # an agent that asks the router to keep its KV over tool calls
        ctx["kv_retention_ttl_seconds"] = kv_retention_ttl_seconds
    return orjson.dumps(ctx).decode()
