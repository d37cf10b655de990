"""Replay facts: one JSON object per replayed request (``progrouter-fact``, version 1), written as it ends.

Times are wall seconds since the replay started; ``time_scale`` is how many modelled seconds one wall second
stands for (the engines' ``--time-scale``), so ``modelled = wall * time_scale``. Token counts come from the
backend's ``usage`` when it reported one. ``status`` is ``ok``, ``error`` or ``cancelled``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import IO, Any

import orjson

from progrouter.workload.trace import TraceProgram, TraceTask

FACT_FORMAT = "progrouter-fact"
FACT_VERSION = 1


@dataclass(slots=True)
class Fact:
    request_id: str
    task_id: str
    program_id: str
    agent_id: str
    agent_role: str
    parent_program_id: str | None
    step_id: int
    task_start: float
    ready_at: float
    started_at: float
    finished_at: float
    input_tokens: int
    planned_output_tokens: int
    time_scale: float = 1.0
    headers_at: float | None = None
    first_token_at: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    status: str = "ok"
    status_code: int | None = None
    error: str | None = None
    rank: int | None = None
    target: str | None = None

    @classmethod
    def start(
        cls,
        task: TraceTask,
        program: TraceProgram,
        step: int,
        *,
        task_start: float,
        ready_at: float,
        started_at: float,
        finished_at: float = 0.0,
        time_scale: float = 1.0,
    ) -> Fact:
        """The fact of a trace request as it is sent: identity and plan; the outcome is filled in later."""
        request = program.requests[step]
        return cls(
            request_id=f"{program.program_id}:{step}",
            task_id=task.task_id,
            program_id=program.program_id,
            agent_id=program.agent_id,
            agent_role=program.role.value,
            parent_program_id=program.parent_program_id,
            step_id=step,
            task_start=task_start,
            ready_at=ready_at,
            started_at=started_at,
            finished_at=finished_at,
            input_tokens=request.input_tokens,
            planned_output_tokens=request.output_tokens,
            time_scale=time_scale,
        )

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started_at

    @property
    def latency(self) -> float:
        return self.finished_at - self.started_at

    def to_json(self) -> bytes:
        return orjson.dumps({"format": FACT_FORMAT, "version": FACT_VERSION, **asdict(self)})


_FIELDS = {f.name for f in fields(Fact)}


def parse_fact(line: bytes | str) -> Fact:
    obj: dict[str, Any] = orjson.loads(line)
    if obj.get("format") != FACT_FORMAT or obj.get("version") != FACT_VERSION:
        raise ValueError(f"not a {FACT_FORMAT} v{FACT_VERSION} line")
    return Fact(**{k: v for k, v in obj.items() if k in _FIELDS})


def iter_facts(lines: Iterable[bytes | str]) -> Iterator[Fact]:
    for line in lines:
        if line.strip():
            yield parse_fact(line)


def load_facts(path: str | Path) -> list[Fact]:
    with open(path, "rb") as f:
        return list(iter_facts(f))


def is_facts_file(path: str | Path) -> bool:
    with open(path, "rb") as f:
        first = f.readline()
    try:
        obj = orjson.loads(first)
    except orjson.JSONDecodeError:
        return False
    return isinstance(obj, dict) and obj.get("format") == FACT_FORMAT


def write_fact(f: IO[bytes], fact: Fact) -> None:
    f.write(fact.to_json() + b"\n")
    f.flush()
