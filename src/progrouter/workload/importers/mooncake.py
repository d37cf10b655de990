"""Mooncake JSONL: ``{"timestamp": ms, "input_length", "output_length", "hash_ids", "session_id"?}`` per line.

Mooncake hash ids name 512-token blocks and are global across requests. Requests with a ``session_id`` form
one task (a lead Program in timestamp order); a request without one is a task of its own. Mooncake is an
open-loop arrival trace, so a request's gap is the time since the previous request of its session arrived
(an upper bound of the tool time: the previous request's service time is inside it); the task starts at its
first arrival.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from progrouter.workload.importers._common import (
    int_list,
    integer,
    jsonl_objects,
    number,
    shared_across_tasks,
)
from progrouter.workload.trace import AgentRole, Trace, TraceProgram, TraceRequest, TraceTask

MOONCAKE_BLOCK_SIZE = 512


def load_mooncake(paths: Sequence[Path], block_size: int | None = None) -> Trace:
    rows: list[tuple[float, int, str, dict[str, Any]]] = []
    for where, obj in jsonl_objects(paths):
        rows.append((number(obj, "timestamp", where) / 1000.0, len(rows), where, obj))
    rows.sort(key=lambda r: (r[0], r[1]))
    t0 = rows[0][0] if rows else 0.0
    sessions: dict[str, list[tuple[float, TraceRequest]]] = {}
    for t, idx, where, obj in rows:
        sid = obj.get("session_id")
        key = f"s-{sid}" if sid is not None else f"r-{idx}"
        req = TraceRequest(
            input_tokens=integer(obj, "input_length", where),
            hash_ids=int_list(obj, "hash_ids", where),
            output_tokens=max(1, integer(obj, "output_length", where)),
        )
        sessions.setdefault(key, []).append((t - t0, req))
    tasks: list[TraceTask] = []
    for key, reqs in sessions.items():
        start = reqs[0][0]
        requests = [
            TraceRequest(r.input_tokens, r.hash_ids, r.output_tokens, 0.0 if i == 0 else t - reqs[i - 1][0])
            for i, (t, r) in enumerate(reqs)
        ]
        lead = TraceProgram(f"{key}:lead", "lead", AgentRole.LEAD, tuple(requests))
        tasks.append(TraceTask(key, start, (lead,)))
    tasks.sort(key=lambda t: t.start)
    size = block_size or MOONCAKE_BLOCK_SIZE
    return Trace(size, tuple(tasks), shared_across_tasks(tasks), source="mooncake", meta={})
