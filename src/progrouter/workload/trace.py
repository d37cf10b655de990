"""The agent trace model and its JSONL file format (``progrouter-trace``, version 1).

A trace is a list of tasks (sessions). A task is a tree of Programs: one lead agent and any number of
subagents, each linked to its parent Program, spawned after one of the parent's requests completes, and either
blocking the parent (the parent's next request waits until the subagent has finished) or not. A Program is an
ordered list of requests; a request is its input as block hash ids of ``block_size`` tokens (equal ids mean an
equal prefix), its input and output token counts, and the gap before it (tool or think time after the previous
completion, after the spawn for a subagent's first request, after the task start for the lead's first).

Block ids are scoped to their task: the same id in two tasks is different content, so tasks never share a
prefix by accident. Ids listed in ``shared_hash_ids`` are global (a system prompt shared across tasks).

File format, one JSON object per line::

    {"type": "header", "format": "progrouter-trace", "version": 1, "block_size": 64,
     "shared_hash_ids": [0, 1], "source": "synthetic:coding", "meta": {...}}
    {"type": "task", "task_id": "t0", "start": 0.0, "programs": [
        {"program_id": "t0:lead", "agent_id": "lead", "role": "lead", "parent_program_id": null,
         "blocks_parent": false, "spawn_after": null, "spawn_reason": null,
         "requests": [{"in": 128, "hash_ids": [0, 1], "out": 16, "gap": 0.0}, ...]}, ...]}

Times are seconds, token counts are tokens. ``spawn_after`` is the index of the parent's request after whose
completion the subagent starts (-1: when the parent starts, before its first request).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

import orjson

TRACE_FORMAT = "progrouter-trace"
TRACE_VERSION = 1


class TraceError(ValueError):
    """A trace that cannot be used; the message says where."""


class AgentRole(StrEnum):
    LEAD = "lead"
    SUBAGENT = "subagent"


@dataclass(frozen=True, slots=True)
class TraceRequest:
    input_tokens: int
    hash_ids: tuple[int, ...]
    output_tokens: int
    gap: float = 0.0


@dataclass(frozen=True, slots=True)
class TraceProgram:
    program_id: str
    agent_id: str
    role: AgentRole
    requests: tuple[TraceRequest, ...]
    parent_program_id: str | None = None
    blocks_parent: bool = False
    spawn_after: int | None = None
    spawn_reason: str | None = None


@dataclass(frozen=True, slots=True)
class TraceTask:
    task_id: str
    start: float
    programs: tuple[TraceProgram, ...]

    @property
    def lead(self) -> TraceProgram:
        return next(p for p in self.programs if p.parent_program_id is None)

    def children(self, program_id: str) -> list[TraceProgram]:
        return [p for p in self.programs if p.parent_program_id == program_id]

    @property
    def num_requests(self) -> int:
        return sum(len(p.requests) for p in self.programs)


@dataclass(frozen=True, slots=True)
class Trace:
    block_size: int
    tasks: tuple[TraceTask, ...]
    shared_hash_ids: frozenset[int] = frozenset()
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate(self)

    @property
    def num_requests(self) -> int:
        return sum(t.num_requests for t in self.tasks)

    def programs(self) -> Iterator[tuple[TraceTask, TraceProgram]]:
        for task in self.tasks:
            for program in task.programs:
                yield task, program

    def scaled(self, *, token_scale: float = 1.0, time_scale: float = 1.0) -> Trace:
        """Every token count times ``token_scale`` (blocks keep their number, so prefixes stay equal) and
        every time times ``time_scale``; both recorded in ``meta`` so a scaled trace says what it is."""
        if token_scale <= 0 or time_scale <= 0 or not math.isfinite(token_scale * time_scale):
            raise TraceError("token_scale and time_scale must be finite and > 0")
        if token_scale == 1.0 and time_scale == 1.0:
            return self

        def tok(n: int, minimum: int) -> int:
            return max(minimum, round(n * token_scale))

        def req(r: TraceRequest) -> TraceRequest:
            return TraceRequest(
                tok(r.input_tokens, 1), r.hash_ids, tok(r.output_tokens, 1), r.gap * time_scale
            )

        tasks = tuple(
            replace(
                t,
                start=t.start * time_scale,
                programs=tuple(replace(p, requests=tuple(req(r) for r in p.requests)) for p in t.programs),
            )
            for t in self.tasks
        )
        meta = dict(self.meta)
        meta["token_scale"] = meta.get("token_scale", 1.0) * token_scale
        meta["time_scale"] = meta.get("time_scale", 1.0) * time_scale
        return Trace(tok(self.block_size, 1), tasks, self.shared_hash_ids, self.source, meta)

    def head(self, num_tasks: int) -> Trace:
        """The first ``num_tasks`` tasks (for a quick look or a smaller run)."""
        return replace(self, tasks=self.tasks[:num_tasks])


def validate(trace: Trace) -> None:
    """Structural checks: one lead per task, parents inside the task, spawn points inside the parent."""
    if trace.block_size <= 0:
        raise TraceError("block_size must be > 0")
    seen_tasks: set[str] = set()
    for task in trace.tasks:
        where = f"task {task.task_id!r}"
        if task.task_id in seen_tasks:
            raise TraceError(f"{where}: duplicate task_id")
        seen_tasks.add(task.task_id)
        if not math.isfinite(task.start) or task.start < 0:
            raise TraceError(f"{where}: start must be finite and >= 0")
        by_id = {p.program_id: p for p in task.programs}
        if len(by_id) != len(task.programs):
            raise TraceError(f"{where}: duplicate program_id")
        leads = [p for p in task.programs if p.parent_program_id is None]
        if len(leads) != 1:
            raise TraceError(f"{where}: needs exactly one Program without a parent, found {len(leads)}")
        for p in task.programs:
            _validate_program(where, p, by_id)
        _check_acyclic(where, by_id)


def _validate_program(where: str, p: TraceProgram, by_id: dict[str, TraceProgram]) -> None:
    here = f"{where}, program {p.program_id!r}"
    if not p.requests:
        raise TraceError(f"{here}: has no requests")
    if p.parent_program_id is not None:
        parent = by_id.get(p.parent_program_id)
        if parent is None:
            raise TraceError(f"{here}: parent {p.parent_program_id!r} is not in the task")
        if p.spawn_after is None or not -1 <= p.spawn_after < len(parent.requests):
            raise TraceError(f"{here}: spawn_after must index one of the parent's requests (or be -1)")
    elif p.blocks_parent or p.spawn_after is not None:
        raise TraceError(f"{here}: a Program without a parent cannot block one or be spawned")
    for i, r in enumerate(p.requests):
        if r.input_tokens <= 0 or r.output_tokens <= 0:
            raise TraceError(f"{here}, request {i}: input and output tokens must be > 0")
        if not math.isfinite(r.gap) or r.gap < 0:
            raise TraceError(f"{here}, request {i}: gap must be finite and >= 0")


def _check_acyclic(where: str, by_id: dict[str, TraceProgram]) -> None:
    for p in by_id.values():
        seen = {p.program_id}
        cur = p
        while cur.parent_program_id is not None:
            if cur.parent_program_id in seen:
                raise TraceError(f"{where}: parent links form a cycle at {cur.program_id!r}")
            seen.add(cur.parent_program_id)
            cur = by_id[cur.parent_program_id]


# --- JSONL ---


def _request_to_json(r: TraceRequest) -> dict[str, Any]:
    return {"in": r.input_tokens, "hash_ids": list(r.hash_ids), "out": r.output_tokens, "gap": r.gap}


def _program_to_json(p: TraceProgram) -> dict[str, Any]:
    return {
        "program_id": p.program_id,
        "agent_id": p.agent_id,
        "role": p.role.value,
        "parent_program_id": p.parent_program_id,
        "blocks_parent": p.blocks_parent,
        "spawn_after": p.spawn_after,
        "spawn_reason": p.spawn_reason,
        "requests": [_request_to_json(r) for r in p.requests],
    }


def dump_lines(trace: Trace) -> Iterator[bytes]:
    header = {
        "type": "header",
        "format": TRACE_FORMAT,
        "version": TRACE_VERSION,
        "block_size": trace.block_size,
        "shared_hash_ids": sorted(trace.shared_hash_ids),
        "source": trace.source,
        "meta": trace.meta,
    }
    yield orjson.dumps(header)
    for t in trace.tasks:
        yield orjson.dumps(
            {
                "type": "task",
                "task_id": t.task_id,
                "start": t.start,
                "programs": [_program_to_json(p) for p in t.programs],
            }
        )


def save(trace: Trace, path: str | Path) -> None:
    with open(path, "wb") as f:
        write(trace, f)


def write(trace: Trace, f: IO[bytes]) -> None:
    for line in dump_lines(trace):
        f.write(line + b"\n")


def load(path: str | Path) -> Trace:
    with open(path, "rb") as f:
        return parse_lines(f)


def parse_lines(lines: Iterable[bytes | str]) -> Trace:
    header: dict[str, Any] | None = None
    tasks: list[TraceTask] = []
    for n, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise TraceError(f"line {n}: not JSON ({exc})") from exc
        if not isinstance(obj, dict):
            raise TraceError(f"line {n}: expected a JSON object")
        if header is None:
            header = _check_header(n, obj)
            continue
        if obj.get("type") != "task":
            raise TraceError(f"line {n}: expected a task line")
        tasks.append(_parse_task(n, obj))
    if header is None:
        raise TraceError("empty trace: no header line")
    return Trace(
        block_size=_int(header, "block_size", "header"),
        tasks=tuple(tasks),
        shared_hash_ids=frozenset(int(x) for x in header.get("shared_hash_ids", [])),
        source=str(header.get("source", "")),
        meta=dict(header.get("meta") or {}),
    )


def _check_header(n: int, obj: dict[str, Any]) -> dict[str, Any]:
    if obj.get("type") != "header" or obj.get("format") != TRACE_FORMAT:
        raise TraceError(f"line {n}: not a {TRACE_FORMAT} header (use `progrouter trace import` for others)")
    version = obj.get("version")
    if version != TRACE_VERSION:
        raise TraceError(f"line {n}: unsupported {TRACE_FORMAT} version {version!r} (know {TRACE_VERSION})")
    return obj


def _int(obj: dict[str, Any], key: str, where: str) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise TraceError(f"{where}: {key} must be an integer")
    return v


def _num(obj: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    v = obj.get(key, default)
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise TraceError(f"{where}: {key} must be a number")
    return float(v)


def _parse_task(n: int, obj: dict[str, Any]) -> TraceTask:
    where = f"line {n}"
    programs = obj.get("programs")
    if not isinstance(programs, list):
        raise TraceError(f"{where}: programs must be a list")
    return TraceTask(
        task_id=str(obj.get("task_id")),
        start=_num(obj, "start", where, 0.0),
        programs=tuple(_parse_program(f"{where}, program {i}", p) for i, p in enumerate(programs)),
    )


def _parse_program(where: str, obj: Any) -> TraceProgram:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected an object")
    reqs = obj.get("requests")
    if not isinstance(reqs, list):
        raise TraceError(f"{where}: requests must be a list")
    try:
        role = AgentRole(obj.get("role", "lead"))
    except ValueError as exc:
        raise TraceError(f"{where}: role must be lead or subagent") from exc
    spawn_after = obj.get("spawn_after")
    return TraceProgram(
        program_id=str(obj.get("program_id")),
        agent_id=str(obj.get("agent_id")),
        role=role,
        requests=tuple(_parse_request(f"{where}, request {i}", r) for i, r in enumerate(reqs)),
        parent_program_id=None if obj.get("parent_program_id") is None else str(obj["parent_program_id"]),
        blocks_parent=bool(obj.get("blocks_parent", False)),
        spawn_after=None if spawn_after is None else _int(obj, "spawn_after", where),
        spawn_reason=None if obj.get("spawn_reason") is None else str(obj["spawn_reason"]),
    )


def _parse_request(where: str, obj: Any) -> TraceRequest:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected an object")
    ids = obj.get("hash_ids", [])
    if not isinstance(ids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
        raise TraceError(f"{where}: hash_ids must be a list of integers")
    return TraceRequest(
        input_tokens=_int(obj, "in", where),
        hash_ids=tuple(ids),
        output_tokens=_int(obj, "out", where),
        gap=_num(obj, "gap", where, 0.0),
    )


def context_blocks(input_tokens: int, block_size: int) -> int:
    """How many blocks an input of ``input_tokens`` spans (the last may be partial)."""
    return -(-input_tokens // block_size)


def program_id(task_id: str, agent_id: str) -> str:
    """A Program id as the router derives it from the canonical context: ``<task_id>:<agent_id>``."""
    return f"{task_id}:{agent_id}"
