"""The ``vllm_xargs.agentic_context`` a replayed request carries: the Program identity the router reads.
Shared by the live replay and the simulator."""

from __future__ import annotations

from typing import Any

import orjson

from progrouter.workload.trace import TraceProgram, TraceTask


def agentic_context(task: TraceTask, program: TraceProgram, step: int, request_id: str) -> str:
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
    return orjson.dumps(ctx).decode()
