"""A small generated coding workload with KV pressure, fast enough to run under every arm in a test."""

from __future__ import annotations

from progrouter.sim.ranks import FleetSpec
from progrouter.workload.generators import CodingWorkload, GapModel, generate
from progrouter.workload.trace import Trace

SMALL = CodingWorkload(
    tasks=6,
    seed=7,
    block_size=16,
    system_prompt_tokens=512,
    task_prompt_tokens=256,
    turns_min=3,
    turns_max=7,
    tool_result_tokens_median=128,
    output_tokens_median=16,
    output_tokens_max=32,
    max_context_tokens=1800,
    gaps=GapModel(median=0.5, sigma=1.0, long_prob=0.1, long_median=8.0),
    subagent_spawn_prob=0.3,
    subagents_max=2,
    subagent_turns_min=2,
    subagent_turns_max=3,
    task_interarrival=0.5,
)
#: Two Ranks of 2,048 KV tokens: the six tasks' contexts do not fit at once.
TIGHT = FleetSpec(ranks=2, num_blocks=128, block_size=16)


def small_trace() -> Trace:
    return generate(SMALL)
