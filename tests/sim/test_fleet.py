"""The fleet-size fast paths change nothing: plain runs give the facts and counters of stepping one by one,
block-key prompts hit the cache exactly where token prompts do, and a run can stop at a modelled time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from progrouter.engine import EngineConfig, EngineCore, PromptBlocks, SamplingParams
from progrouter.engine.profiles import load_profile
from progrouter.engine.request import chain_hashes
from progrouter.sim.arms import standard_arm, variant_arm
from progrouter.sim.ranks import FleetSpec
from progrouter.sim.simulation import ArmResult, Simulation
from progrouter.workload.agentic import AgenticWorkload, LogNormal, generate_agentic
from progrouter.workload.prompts import PromptBuilder
from progrouter.workload.trace import Trace

pytestmark = pytest.mark.timeout(120)

PROFILE = load_profile("h200-llama-8b")
#: Agentic sessions shrunk to small Ranks (contexts of 8-28k tokens on 32k-token Ranks), the measured gaps
#: and outputs.
SMALL = AgenticWorkload(
    tasks=16, seed=7, block_size=256, system_prompt_tokens=4096, start_tokens=LogNormal(6000, 20000),
    max_context_tokens=28_000, compact_tokens=8000,
)  # fmt: skip
FLEET = FleetSpec(
    ranks=2, num_blocks=128, block_size=256, prefill_cost_model=PROFILE.prefill_cost_model,
    decode_throughput_model=PROFILE.decode_throughput_model,
)  # fmt: skip


def simulate(trace: Trace, fleet: FleetSpec, arm: str, until: float | None = 900.0) -> ArmResult:
    base = {"token_capacity_per_dp_rank": fleet.capacity_tokens, "global_queue": True}
    sim_arm = variant_arm(arm, base, {}) if arm == "capacity" else standard_arm(arm, base)
    return Simulation(trace, fleet, sim_arm, max_concurrent_tasks=16, until=until).run()


def outcome(result: ArmResult) -> list[tuple[object, ...]]:
    return sorted(
        (f.request_id, f.status, f.headers_at, f.first_token_at, f.finished_at, f.cached_tokens, f.rank)
        for f in result.facts
    )


@pytest.mark.parametrize(("arm", "block_size"), [("native", 256), ("capacity", 256), ("native", 64)])
def test_plain_runs_change_nothing(arm: str, block_size: int) -> None:
    trace = generate_agentic(replace(SMALL, block_size=block_size))
    fleet = replace(FLEET, block_size=block_size, num_blocks=FLEET.capacity_tokens // block_size)
    fast = simulate(trace, fleet, arm)
    slow = simulate(trace, replace(fleet, plain_runs=False), arm)
    assert outcome(fast) == outcome(slow)
    assert len(fast.facts) > 50
    for key in ("token_cache_hit", "preemptions"):
        assert fast.figures.get(key) == slow.figures.get(key)
    assert fast.events < slow.events  # and it is the fast path: fewer events for the same result


def test_the_comparison_sees_pressure() -> None:
    """The equivalence above is checked where it matters: Ranks evict, preempt and queue."""
    trace = generate_agentic(SMALL)
    result = simulate(trace, FLEET, "native")
    sims = Simulation(trace, FLEET, standard_arm("native", {}), max_concurrent_tasks=16, until=900.0)
    sims.run()
    assert sum(r.core.stats.num_preemptions for r in sims.ranks) > 0
    assert sum(r.core.kv.pool.num_evictions for r in sims.ranks) > 0
    assert 0.0 < (result.figures.get("token_cache_hit") or 0.0) < 0.95


def test_until_stops_at_the_modelled_time() -> None:
    trace = generate_agentic(SMALL)
    result = simulate(trace, FLEET, "native", until=120.0)
    assert result.facts and max(f.finished_at for f in result.facts) <= 120.0
    assert len(result.facts) < len(simulate(trace, FLEET, "native", until=600.0).facts)


def test_block_keys_hit_the_cache_where_tokens_do() -> None:
    """Turns of two sessions (shared system prompt, private growth, a partial last block) on one core with
    token prompts and on one with block-key prompts: every request reports the same cached tokens."""
    trace = generate_agentic(replace(SMALL, tasks=3, block_size=64, max_context_tokens=20_000))
    config = EngineConfig(num_blocks=2000, block_size=128, max_model_len=64_000)
    builder = PromptBuilder(trace)
    by_tokens, by_keys = EngineCore(config), EngineCore(config)
    now = 0.0
    seen = 0
    for task in trace.tasks:
        for program in task.programs:
            for step, request in enumerate(program.requests[:6]):
                rid = f"{program.program_id}:{step}"
                params = SamplingParams(max_tokens=request.output_tokens, min_tokens=1, ignore_eos=True)
                tokens = builder.token_ids(task.task_id, rid, request).tolist()
                keys = builder.block_keys(task.task_id, rid, request, 128)
                assert keys is not None
                hashes = builder.block_hashes(program.program_id, task.task_id, rid, request, 128)
                assert hashes == chain_hashes(keys)  # the incremental chain is the whole chain
                by_tokens.add_request(rid, tokens, params, now)
                by_keys.add_request(rid, PromptBlocks(request.input_tokens, hashes), params, now)
                cached = []
                for core in (by_tokens, by_keys):
                    while core.has_work():
                        for out in core.step(now).outputs:
                            if out.finished:
                                cached.append(out.num_cached_tokens)
                assert cached[0] == cached[1]
                seen += cached[0] > 0
    assert seen > 5  # the prefixes were really reused
    assert builder.block_keys("t", "r", trace.tasks[0].lead.requests[0], 96) is None  # not whole trace blocks
