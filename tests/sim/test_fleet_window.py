"""bench/fleet_sim.py's measured window: with ``--warmup-hours`` every figure covers only the requests (and
sessions) that started after the warm-up, counters that only accumulate start from their value then, and the
Little's-law JCT agrees with the sessions' measured JCT when every session is alike."""

from __future__ import annotations

import statistics
from types import ModuleType

import pytest

from progrouter.engine.profiles import with_cost_models
from progrouter.sim.arms import standard_arm
from progrouter.sim.simulation import Simulation
from progrouter.workload.trace import Trace

from .bench_modules import bench_module
from .test_improvements import BLOCK, FLEET, PROFILE, agent

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def fleet() -> ModuleType:
    return bench_module("fleet_sim")


def simulate(trace: Trace, arm: str, agents: int, until: float, since: float, fleet: ModuleType) -> tuple:
    base = with_cost_models({}, PROFILE.prefill_cost_model, PROFILE.decode_throughput_model)
    sim = Simulation(trace, FLEET, standard_arm(arm, base), max_concurrent_tasks=agents, until=until)
    samples = fleet.sample_every(sim, until, since)
    base_counts = fleet.baseline_at(sim, since)
    sim.advance()
    return sim, samples, base_counts


def test_the_window_leaves_the_warm_up_out(fleet: ModuleType) -> None:
    # Three contexts of ~80k tokens on KV for two: the engine preempts, before and after the warm-up.
    trace = Trace(BLOCK, tuple(agent(t, turns=6, gap=20.0) for t in range(12)), source="test")
    sim, samples, base = simulate(trace, "program", agents=3, until=1200.0, since=400.0, fleet=fleet)
    whole = fleet.summarize(sim, fleet.Samples(), PROFILE, 0.0)
    window = fleet.summarize(sim, samples, PROFILE, 0.0, 400.0, base)
    late = [f for f in sim.facts if f.ok and f.started_at >= 400.0]
    assert 0 < window["requests_completed"] == len(late) < whole["requests_completed"]
    preempted = sum(r.core.stats.num_preemptions for r in sim.ranks)
    assert 0 < base.preemptions <= preempted and window["preemptions"] == preempted - base.preemptions
    assert base.transitions > 0 and sum(window["transitions"].values()) <= sum(whole["transitions"].values())
    assert samples.times and min(samples.times) == 400.0
    started = sim.agents.task_start
    assert window["sessions_completed"] == sum(
        1
        for t in trace.tasks
        if t.task_id in started and started[t.task_id] >= 400.0
        and sum(f.task_id == t.task_id for f in late) == t.num_requests
    )  # fmt: skip
    censored = fleet.censored_latency(sim, list(sim.facts), 1200.0, 400.0)
    assert censored == pytest.approx(statistics.fmean(f.finished_at - f.started_at for f in late))


def test_little_jct_matches_the_sessions_jct_when_sessions_are_alike(fleet: ModuleType) -> None:
    # Small contexts, nothing evicted: every session takes about as long; many end inside the window.
    trace = Trace(BLOCK, tuple(agent(t, 4, 30.0, start_blocks=8) for t in range(200)), source="test")
    sim, samples, base = simulate(trace, "native", agents=4, until=3000.0, since=600.0, fleet=fleet)
    window = fleet.summarize(sim, samples, PROFILE, 0.0, 600.0, base)
    assert len(sim.agents.task_start) < len(trace.tasks)  # load held at four agents all along
    little = fleet.little_jct(4, 2400.0, window["requests_completed"], trace)
    assert window["sessions_completed"] > 40
    assert little == pytest.approx(window["jct_seconds"]["mean"], rel=0.05)
    assert fleet.little_jct(4, 2400.0, 0, trace) is None


def test_variant_hints_reach_their_arms_and_bad_ones_are_refused(fleet: ModuleType) -> None:
    variants = fleet.parse_variants(['a={"global_queue": true}', "b={}"])
    hints = fleet.parse_variant_hints(["a=next-gap:60", "b=2.5"], variants)
    assert hints == {"a": "next-gap:60", "b": 2.5}
    arms = {a.name: a for a in fleet.build_arms(["native"], PROFILE, FLEET, 4, variants, hints)}
    assert (arms["native"].hint, arms["a"].hint, arms["b"].hint) == (None, "next-gap:60", 2.5)
    for bad in (["c=next-gap"], ["a=soon"], ["a=1", "a=2"], ["a"]):
        with pytest.raises(SystemExit):
            fleet.parse_variant_hints(bad, variants)
