"""bench/miss_causes.py charges each lost prompt token to the place it went missing: on the hand-built
three-agents-two-slots case the spec's TTL pauses every Program (losses: evicted while paused by the TTL),
native routing pauses nobody (losses: evicted while the Program was between turns, still "active")."""

from __future__ import annotations

from types import ModuleType

import pytest

from progrouter.engine.profiles import with_cost_models
from progrouter.sim.arms import standard_arm, variant_arm
from progrouter.sim.simulation import Simulation
from progrouter.workload.trace import Trace

from .bench_modules import bench_module
from .test_improvements import BLOCK, FLEET, PROFILE, agent

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def miss_causes() -> ModuleType:
    return bench_module("miss_causes")


def follow(miss_causes: ModuleType, program: bool) -> dict[str, object]:
    trace = Trace(BLOCK, tuple(agent(t, turns=8, gap=20.0) for t in range(3)), source="test")
    base = with_cost_models({}, PROFILE.prefill_cost_model, PROFILE.decode_throughput_model)
    config = {
        "token_capacity_per_dp_rank": FLEET.capacity_tokens,
        "global_queue": True,
        "stats_window_size": 5,
    }
    arm = variant_arm("arm", base, config) if program else standard_arm("native", base)
    sim = Simulation(trace, FLEET, arm, until=900.0)
    follower = miss_causes.Follower(sim)
    sim.run()
    report: dict[str, object] = follower.report()
    return report


def losses(report: dict[str, object]) -> dict[str, float]:
    lost = report["lost_share_of_prompt_tokens"]
    assert isinstance(lost, dict) and lost
    return lost


def top(lost: dict[str, float]) -> str:
    return max(lost.items(), key=lambda kv: kv[1])[0]


def test_the_spec_ttl_loses_kv_while_paused(miss_causes: ModuleType) -> None:
    report = follow(miss_causes, program=True)
    lost = losses(report)
    assert top(lost).startswith("evicted_while_paused:ttl_expired")
    assert not any(cause.startswith("evicted_while_active") for cause in lost)


def test_native_loses_kv_between_turns(miss_causes: ModuleType) -> None:
    report = follow(miss_causes, program=False)
    lost = losses(report)
    assert top(lost) == "evicted_while_active"
    assert not any(cause.startswith("evicted_while_paused") for cause in lost)
    inherent = report["inherent_share_of_prompt_tokens"]
    assert isinstance(inherent, dict) and inherent["first_turn"] > 0
