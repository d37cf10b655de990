"""kv-cache-tester session JSON: one file per session, lead requests and nested subagents.

A session is ``{"id", "block_size", "requests": [...]}``. A request is ``{"t", "type": "n", "model", "in",
"out", "hash_ids", "think_time", "api_time", "stop"}`` (``t`` seconds since the session start, ``think_time``
the gap before it). A subagent entry is ``{"type": "subagent", "agent_id", "subagent_type", "t",
"duration_ms", "requests": [...]}`` whose nested ``t`` restart at 0; it may nest further subagents.

Mapping: a session is a task, its top-level requests the lead Program. A subagent is spawned after the
parent's last request listed before it (-1 if none) and blocks the parent when the parent's next request
starts only after the subagent has finished (kv-cache-tester does not record blocking explicitly). A file
may also hold a list of sessions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from progrouter.workload.importers._common import int_list, integer, number, shared_across_tasks
from progrouter.workload.trace import (
    AgentRole,
    Trace,
    TraceError,
    TraceProgram,
    TraceRequest,
    TraceTask,
    program_id,
)

#: A subagent that ends this close to (or after) the parent's next request counts as blocking it.
BLOCKING_SLACK_SECONDS = 0.5


def load_kv_cache_tester(paths: Sequence[Path], block_size: int | None = None) -> Trace:
    sessions: list[tuple[str, dict[str, Any]]] = []
    for path in paths:
        data = orjson.loads(Path(path).read_bytes())
        items = data if isinstance(data, list) else [data]
        for i, s in enumerate(items):
            if not isinstance(s, dict):
                raise TraceError(f"{path}: session {i} is not an object")
            sessions.append((f"{path}[{i}]", s))
    sizes = {integer(s, "block_size", where, 64) for where, s in sessions}
    if len(sizes) > 1:
        raise TraceError(f"sessions disagree on block_size: {sorted(sizes)}")
    size = sizes.pop() if sizes else (block_size or 64)
    tasks = tuple(_session(where, s) for where, s in sessions)
    return Trace(size, tasks, shared_across_tasks(tasks), source="kv-cache-tester", meta={})


def _session(where: str, s: dict[str, Any]) -> TraceTask:
    task_id = str(s.get("id") or where)
    programs: list[TraceProgram] = []
    _program(f"{where} session {task_id!r}", task_id, "lead", None, None, s, programs)
    return TraceTask(task_id, 0.0, tuple(programs))


def _program(
    where: str,
    task_id: str,
    agent_id: str,
    parent: str | None,
    spawn: tuple[int, bool, str | None] | None,
    obj: dict[str, Any],
    out: list[TraceProgram],
) -> None:
    """Append the Program described by ``obj`` (and, recursively, its subagents) to ``out``."""
    entries = obj.get("requests")
    if not isinstance(entries, list):
        raise TraceError(f"{where}: 'requests' must be a list")
    pid = program_id(task_id, agent_id)
    requests: list[TraceRequest] = []
    starts: list[float] = []
    pending: list[tuple[dict[str, Any], int, float]] = []  # subagent entry, spawn_after, end time
    prev_end: float | None = None
    for i, e in enumerate(entries):
        here = f"{where}, entry {i}"
        if not isinstance(e, dict):
            raise TraceError(f"{here}: expected an object")
        kind = e.get("type", "n")
        t = number(e, "t", here, 0.0)
        if kind == "subagent":
            end = t + number(e, "duration_ms", here, 0.0) / 1000.0
            pending.append((e, len(requests) - 1, end))
            continue
        if kind != "n":
            raise TraceError(f"{here}: unknown entry type {kind!r}")
        think = e.get("think_time")
        if think is None:
            gap = t if prev_end is None else max(0.0, t - prev_end)
        else:
            gap = number(e, "think_time", here)
        api = number(e, "api_time", here, 0.0)
        prev_end = t + api
        starts.append(t)
        requests.append(
            TraceRequest(integer(e, "in", here), int_list(e, "hash_ids", here), integer(e, "out", here), gap)
        )
    if not requests:
        raise TraceError(f"{where}: a Program needs at least one request")
    spawn_after, blocks, reason = spawn if spawn is not None else (None, False, None)
    out.append(
        TraceProgram(
            program_id=pid,
            agent_id=agent_id,
            role=AgentRole.LEAD if parent is None else AgentRole.SUBAGENT,
            requests=tuple(requests),
            parent_program_id=parent,
            blocks_parent=blocks,
            spawn_after=spawn_after,
            spawn_reason=reason,
        )
    )
    for n, (e, after, end) in enumerate(pending):
        here = f"{where}, subagent {n}"
        agent = str(e.get("agent_id") or f"subagent-{n}")
        following = starts[after + 1] if after + 1 < len(starts) else None
        blocks_parent = following is not None and end <= following + BLOCKING_SLACK_SECONDS
        sub_type = e.get("subagent_type")
        spawn_info = (after, blocks_parent, None if sub_type is None else str(sub_type))
        _program(here, task_id, agent, pid, spawn_info, e, out)
