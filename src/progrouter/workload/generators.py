"""Synthetic agent workloads, seeded: the same parameters and seed give the same trace, byte for byte.

``coding``: coding-agent tasks. Every Program's prompt starts with a system prompt shared by all tasks, then
its own instructions; each turn appends the model's output and a tool result, so the context grows turn by
turn and each request's prefix is the previous request's whole prompt. Tool gaps are log-normal with a
short-gap majority plus a long-tail component. A lead spawns, now and then, a few subagents in parallel that
block it until they finish; a subagent starts from the system prompt and its own brief.

``long_tool``: the same shape with long tool calls only (every gap far above the cache-miss impact of the
context), the spec's non-regression case where Progress-TTL should arm nothing.

Blocks are whole (``block_size`` tokens); the context grows by whole blocks, so the prefix structure is exact.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from progrouter.workload.trace import AgentRole, Trace, TraceProgram, TraceRequest, TraceTask, program_id

PRIVATE_BASE = 1 << 30


@dataclass(frozen=True, slots=True)
class GapModel:
    """Log-normal tool gaps: ``median``/``sigma`` for most, a ``long_prob`` share from the long tail."""

    median: float = 0.5
    sigma: float = 1.0
    long_prob: float = 0.08
    long_median: float = 30.0
    long_sigma: float = 0.6

    def sample(self, rng: np.random.Generator) -> float:
        if rng.random() < self.long_prob:
            return float(self.long_median * math.exp(self.long_sigma * rng.standard_normal()))
        return float(self.median * math.exp(self.sigma * rng.standard_normal()))


@dataclass(frozen=True, slots=True)
class CodingWorkload:
    """Parameters of the synthetic coding-agent workload (token counts in tokens, times in seconds)."""

    tasks: int = 16
    seed: int = 0
    block_size: int = 64
    system_prompt_tokens: int = 4096
    task_prompt_tokens: int = 1024
    turns_min: int = 10
    turns_max: int = 30
    tool_result_tokens_median: int = 512
    output_tokens_median: int = 128
    output_tokens_max: int = 512
    max_context_tokens: int = 64_000
    gaps: GapModel = field(default_factory=GapModel)
    subagent_spawn_prob: float = 0.1
    subagents_max: int = 3
    subagent_turns_min: int = 3
    subagent_turns_max: int = 10
    task_interarrival: float = 0.0
    long_tool: bool = False

    def to_meta(self) -> dict[str, Any]:
        return {"generator": "long_tool" if self.long_tool else "coding", **asdict(self)}


def long_tool_workload(**overrides: Any) -> CodingWorkload:
    """The long-tool-call case: gaps of tens of seconds, never short."""
    base: dict[str, Any] = {
        "gaps": GapModel(median=45.0, sigma=0.4, long_prob=0.0),
        "long_tool": True,
        "subagent_spawn_prob": 0.05,
    }
    base.update(overrides)
    return CodingWorkload(**base)


class BlockIds:
    """Allocates task-private block ids; ids below PRIVATE_BASE are the shared system prompt."""

    def __init__(self) -> None:
        self._next = PRIVATE_BASE

    def take(self, n: int) -> list[int]:
        ids = list(range(self._next, self._next + n))
        self._next += n
        return ids


def generate(w: CodingWorkload) -> Trace:
    rng = np.random.default_rng(w.seed)
    sys_blocks = list(range(_blocks_for(w.system_prompt_tokens, w.block_size)))
    tasks = []
    for n in range(w.tasks):
        task_id = f"task-{n:04d}"
        start = n * w.task_interarrival
        tasks.append(TraceTask(task_id, start, tuple(_task(w, rng, task_id, sys_blocks))))
    return Trace(
        w.block_size, tuple(tasks), frozenset(sys_blocks), source=f"synthetic:{_name(w)}", meta=w.to_meta()
    )


def _name(w: CodingWorkload) -> str:
    return "long_tool" if w.long_tool else "coding"


def _blocks_for(tokens: int, block_size: int) -> int:
    return max(1, round(tokens / block_size))


def _lognormal_int(rng: np.random.Generator, median: int, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(median * math.exp(sigma * rng.standard_normal())))))


def _task(
    w: CodingWorkload, rng: np.random.Generator, task_id: str, sys_blocks: list[int]
) -> list[TraceProgram]:
    alloc = BlockIds()
    lead_id = program_id(task_id, "lead")
    turns = int(rng.integers(w.turns_min, w.turns_max + 1))
    lead_reqs = _turns(w, rng, alloc, sys_blocks, turns, first_gap=0.0)
    programs = [TraceProgram(lead_id, "lead", AgentRole.LEAD, tuple(lead_reqs))]
    sub_n = 0
    for step in range(len(lead_reqs) - 1):  # subagents after a request that has a successor to block
        if rng.random() >= w.subagent_spawn_prob:
            continue
        for _ in range(int(rng.integers(1, w.subagents_max + 1))):
            agent = f"sub-{sub_n}"
            sub_n += 1
            sub_turns = int(rng.integers(w.subagent_turns_min, w.subagent_turns_max + 1))
            reqs = _turns(w, rng, alloc, sys_blocks, sub_turns, first_gap=float(rng.uniform(0.0, 0.2)))
            programs.append(
                TraceProgram(
                    program_id(task_id, agent),
                    agent,
                    AgentRole.SUBAGENT,
                    tuple(reqs),
                    parent_program_id=lead_id,
                    blocks_parent=True,
                    spawn_after=step,
                    spawn_reason="task",
                )
            )
    return programs


def _turns(
    w: CodingWorkload,
    rng: np.random.Generator,
    alloc: BlockIds,
    sys_blocks: list[int],
    turns: int,
    first_gap: float,
) -> list[TraceRequest]:
    """One Program's requests: the context grows by the previous output plus a tool result each turn."""
    blocks = sys_blocks + alloc.take(_blocks_for(w.task_prompt_tokens, w.block_size))
    max_blocks = max(len(blocks) + 1, w.max_context_tokens // w.block_size)
    out: list[TraceRequest] = []
    for i in range(turns):
        output = _lognormal_int(rng, w.output_tokens_median, 0.6, 1, w.output_tokens_max)
        gap = first_gap if i == 0 else w.gaps.sample(rng)
        out.append(TraceRequest(len(blocks) * w.block_size, tuple(blocks), output, gap))
        tool = _lognormal_int(rng, w.tool_result_tokens_median, 0.8, 1, 16 * w.tool_result_tokens_median)
        grow = max(1, round((output + tool) / w.block_size))
        if len(blocks) + grow > max_blocks:
            break
        blocks = blocks + alloc.take(grow)
    return out
