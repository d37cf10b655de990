"""``agentic``: Claude-Code-shaped sessions at full token scale, seeded (same parameters, same trace).

The defaults match the statistics of 200 public Claude Code session traces (9,701 requests): input tokens per
request p10 50k / p50 114k / p90 306k; context growth per turn p50 876 / p90 4,577; output tokens p50 237 /
p90 862; turns per session p50 25 / p90 104; think/tool gaps p10 5 s, p25 7 s, p50 13 s, p75 45 s, p90 187 s,
p99 2,462 s (0.9 % within 1 s, 42.6 % within 10 s); about 5 % of sessions start subagents.

A session (task) is one lead Program. Its first request carries a starting context: the system prompt shared
by every session, then session-private tokens (log-normal, so that the per-request input quantiles above come
out once growth is added); every later request appends a log-normal growth (the model's output, tool results,
the user's words). Turns per session, outputs and growths are log-normal fitted to their p50/p90; gaps are
drawn from the empirical quantiles above (log-linear between them). A session that starts subagents spawns
1-3 of them after one of its requests; they block the lead and start from the system prompt and a brief.

``max_context_tokens`` caps the context as an agent harness does: a request that would exceed it compacts the
session instead (the context restarts from the system prompt plus a summary, in fresh blocks), so a capped
trace keeps its turns and only loses prefix reuse at the compaction, as a real compaction does.

Blocks are ids of whole ``block_size``-token blocks; a request's partial last block has no id (the prompt
builder pads it with request-unique tokens), as the engine caches only full blocks.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from progrouter.workload.generators import BlockIds
from progrouter.workload.trace import AgentRole, Trace, TraceProgram, TraceRequest, TraceTask, program_id

Z90 = 1.2815515655446004  # the standard normal's 90th percentile

#: Think/tool gap quantiles (probability, seconds) of the measured sessions; log-linear in between.
GAP_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.0, 0.3), (0.009, 1.0), (0.10, 5.0), (0.25, 7.0), (0.426, 10.0), (0.50, 13.0), (0.75, 45.0),
    (0.90, 187.0), (0.99, 2462.0), (1.0, 7200.0),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class LogNormal:
    """Fitted to a median and a 90th percentile."""

    p50: float
    p90: float

    def sample(self, rng: np.random.Generator, lo: float = 1.0, hi: float = math.inf) -> float:
        sigma = math.log(self.p90 / self.p50) / Z90
        return min(hi, max(lo, self.p50 * math.exp(sigma * rng.standard_normal())))


@dataclass(frozen=True, slots=True)
class AgenticWorkload:
    tasks: int = 200
    seed: int = 0
    block_size: int = 64
    system_prompt_tokens: int = 16_000
    # The session-private part of the first request (tuned so the per-request input quantiles match).
    start_tokens: LogNormal = LogNormal(38_000, 85_000)
    growth_tokens: LogNormal = LogNormal(876, 4_577)
    output_tokens: LogNormal = LogNormal(237, 862)
    output_tokens_max: int = 32_000
    turns: LogNormal = LogNormal(25, 104)
    turns_max: int = 1_000
    subagent_session_prob: float = 0.05
    subagents_max: int = 3
    subagent_brief_tokens: LogNormal = LogNormal(4_000, 16_000)
    subagent_turns: LogNormal = LogNormal(8, 30)
    max_context_tokens: int = 450_000  # compaction here reproduces the measured tail (p90 306k)
    compact_tokens: int = 24_000  # system prompt plus the summary a compaction leaves
    task_interarrival: float = 0.0

    def to_meta(self) -> dict[str, Any]:
        return {"generator": "agentic", **asdict(self)}


def sample_gap(rng: np.random.Generator) -> float:
    """One think/tool gap from the empirical quantiles (inverse CDF, log-linear between the points)."""
    u = float(rng.random())
    for (p0, g0), (p1, g1) in itertools.pairwise(GAP_QUANTILES):
        if u <= p1:
            t = (u - p0) / (p1 - p0)
            return math.exp(math.log(g0) + t * (math.log(g1) - math.log(g0)))
    return GAP_QUANTILES[-1][1]


class _Context:
    """One Program's growing context: token count and the ids of its full blocks."""

    def __init__(self, w: AgenticWorkload, ids: BlockIds, system_blocks: list[int], tokens: int) -> None:
        self._w = w
        self._ids = ids
        self._system = system_blocks
        self.tokens = 0
        self.blocks: list[int] = []
        self._fill(min(tokens, w.max_context_tokens))

    def _fill(self, tokens: int) -> None:
        """Fresh blocks after the system prompt up to ``tokens``."""
        self.tokens = tokens
        self.blocks = list(self._system)
        self._extend()

    def _extend(self) -> None:
        full = self.tokens // self._w.block_size
        if full > len(self.blocks):
            self.blocks.extend(self._ids.take(full - len(self.blocks)))

    def grow(self, tokens: int) -> None:
        """Append ``tokens``, or compact if the context would pass the cap."""
        w = self._w
        if self.tokens + tokens > w.max_context_tokens:
            self._fill(min(w.compact_tokens, w.max_context_tokens // 2))
        else:
            self.tokens += tokens
            self._extend()

    def request(self, output: int, gap: float) -> TraceRequest:
        return TraceRequest(self.tokens, tuple(self.blocks), output, gap)


def generate_agentic(w: AgenticWorkload) -> Trace:
    if w.max_context_tokens <= w.system_prompt_tokens + 2 * w.block_size:
        raise ValueError(f"max_context_tokens ({w.max_context_tokens}) must exceed the system prompt")
    rng = np.random.default_rng(w.seed)
    system = list(range(w.system_prompt_tokens // w.block_size))
    tasks = tuple(
        TraceTask(f"task-{n:05d}", n * w.task_interarrival, _session(w, rng, f"task-{n:05d}", system))
        for n in range(w.tasks)
    )
    return Trace(w.block_size, tasks, frozenset(system), source="synthetic:agentic", meta=w.to_meta())


def _program(
    w: AgenticWorkload,
    rng: np.random.Generator,
    ids: BlockIds,
    system: list[int],
    start: int,
    turns: int,
    gap0: float,
) -> tuple[TraceRequest, ...]:
    ctx = _Context(w, ids, system, start)
    out: list[TraceRequest] = []
    for i in range(turns):
        if i:
            ctx.grow(round(w.growth_tokens.sample(rng)))
        output = round(w.output_tokens.sample(rng, hi=w.output_tokens_max))
        out.append(ctx.request(output, gap0 if i == 0 else sample_gap(rng)))
    return tuple(out)


def _session(
    w: AgenticWorkload, rng: np.random.Generator, task_id: str, system: list[int]
) -> tuple[TraceProgram, ...]:
    ids = BlockIds()
    sys_tokens = len(system) * w.block_size
    turns = round(w.turns.sample(rng, hi=w.turns_max))
    start = sys_tokens + round(w.start_tokens.sample(rng))
    lead_id = program_id(task_id, "lead")
    programs = [
        TraceProgram(lead_id, "lead", AgentRole.LEAD, _program(w, rng, ids, system, start, turns, 0.0))
    ]
    if turns < 2 or rng.random() >= w.subagent_session_prob:
        return tuple(programs)
    after = int(rng.integers(0, turns - 1))  # a request that has a successor to block
    for n in range(int(rng.integers(1, w.subagents_max + 1))):
        agent = f"sub-{n}"
        sub_start = sys_tokens + round(w.subagent_brief_tokens.sample(rng))
        sub_turns = round(w.subagent_turns.sample(rng, hi=w.turns_max))
        requests = _program(w, rng, ids, system, sub_start, sub_turns, float(rng.uniform(0.0, 0.5)))
        programs.append(
            TraceProgram(
                program_id(task_id, agent),
                agent,
                AgentRole.SUBAGENT,
                requests,
                parent_program_id=lead_id,
                blocks_parent=True,
                spawn_after=after,
                spawn_reason="task",
            )
        )
    return tuple(programs)
