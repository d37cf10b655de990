"""ProgramScheduler, issue-5 rules: rolling statistics, Progress-TTL, reserve, batch gain, repair, retention,
shared prefix, force resume, backend observation and global queue."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from conftest import POOL, T0, T1, Harness
from progrouter.program.core.factors import RequestSample
from progrouter.program.core.state import Program
from progrouter.program.formulas.ttl_fit import completion_cache_miss_impact, fitted_acting_ttl
from progrouter.program.types import BackendObservation

pytestmark = pytest.mark.timeout(30)


def sample(
    *, growth: int | None = None, rounds: int = 1, decode: float | None = None, at: float = 0.0
) -> RequestSample:
    return RequestSample(
        prompt_tokens=1000,
        completion_tokens=100,
        cached_prompt_tokens=900,
        context_growth_tokens=growth,
        e2e_seconds=1.0,
        decode_seconds=decode,
        queue_seconds=0.0,
        rounds_since_ttl_pause=rounds,
        finished_at=at,
    )


def mature_window(h: Harness, target: str, samples: list[RequestSample]) -> None:
    """Fill a Rank's request window with known samples (the window belongs to ``factors.RankFactors``)."""
    factors = h.scheduler.parts.stats.of(target)
    for s in samples:
        factors.push_request(s)


def continuous_rounds(h: Harness, program_id: str, rounds: int, *, context: int = 100) -> None:
    """Serve ``rounds`` requests that keep the KV (full cache hits), staying Active through a long TTL."""
    for _ in range(rounds):
        handle = h.at(h.now + 0.1).arrive(program_id, context, kv_retention_ttl_seconds=1000.0)
        assert h.dispatched(handle)
        h.at(h.now + 0.1).complete(handle, prompt=context, cached=context)


# --------------------------------------------------------------------------------------------- reserve
def test_growth_reserve_9000_through_admission(harness: Any) -> None:
    h: Harness = harness(token_capacity_per_dp_rank=1_000_000, stats_window_size=3)
    continuous_rounds(h, "a", 4)
    continuous_rounds(h, "b", 5)
    assert (h.program("a")["rounds_since_activation"], h.program("b")["rounds_since_activation"]) == (4, 5)  # type: ignore[index]
    mature_window(h, T0, [sample(growth=1000, rounds=3, at=h.now + i) for i in range(3)])
    h.at(h.now + 5).arrive("c", 100)
    [admit] = [e for e in h.events("program_admit") if e["reserve_tokens"]]
    # target rounds ceil(2 × 3) = 6; remaining rounds of a, b: 2, 1; 1000 × (6 + 2 + 1)
    assert admit["reserve_tokens"] == pytest.approx(9000.0)
    assert h.histogram_values("admission_growth_reserve_tokens", target=T0)[-1] == pytest.approx(9000.0)


def test_growth_reserve_blocks_and_batch_gain_admits(harness: Any) -> None:
    config = {
        "token_capacity_per_dp_rank": 100_000,
        "stats_window_size": 2,
        "max_active_programs_per_target": 8,
    }
    for enabled in (True, False):
        h: Harness = harness(enable_batch_gain_admission=enabled, **config)
        continuous_rounds(h, "a", 2)  # a used up its protected rounds: no continuity loss
        mature_window(
            h, T0, [sample(growth=1_000_000, rounds=1, decode=10.0, at=h.now + i) for i in range(2)]
        )
        h.at(h.now + 1).arrive("a", 100, kv_retention_ttl_seconds=1000.0)  # a is Reasoning: batch of 1
        c = h.arrive("c", 1)
        assert h.dispatched(c) is enabled
        assert (h.transitions("batch_gain_admit") == [T0]) is enabled


# ---------------------------------------------------------------------------------------------- TTL fit
def test_fitted_ttl_arms_once_the_continuity_window_is_complete(harness: Any) -> None:
    h: Harness = harness(stats_window_size=5)
    gaps = [0.3, 0.5, 0.7, 0.4, 0.6]
    handle = h.arrive("a", 20_000)
    h.at(0.2).complete(handle, prompt=20_000)
    for gap in gaps:
        assert h.program("a")["state"] == "paused"  # type: ignore[index]  # immature: TTL 0
        handle = h.at(h.now + gap).arrive("a", 20_000)
        h.at(h.now + 0.2).complete(handle, prompt=20_000)
    armed = h.histogram_values("armed_ttl_seconds", source="fitted")
    assert armed[:-1] == [0.0] * len(gaps)
    impact = completion_cache_miss_impact(h.config.prefill_cost_model, 20_000, 0)
    expected = fitted_acting_ttl(gaps, impact, h.config.max_acting_ttl_seconds, window_complete=True)
    assert expected > 0.5
    assert armed[-1] == pytest.approx(expected)
    program = h.program("a")
    assert program is not None and (program["state"], program["status"]) == ("active", "acting")
    assert h.rank()["rolling"]["continuity_window_complete"]


def test_the_fixed_policy_holds_every_idle_program_for_the_cap_from_the_first_completion(
    harness: Any,
) -> None:
    """``acting_ttl_policy: fixed`` arms ``max_acting_ttl_seconds`` whatever the window says (the spec's
    arms 0 until the window is complete); a request's hint still comes first."""
    h: Harness = harness(acting_ttl_policy="fixed", max_acting_ttl_seconds=45.0)
    handle = h.arrive("a", 20_000)
    h.at(0.2).complete(handle, prompt=20_000)
    assert h.histogram_values("armed_ttl_seconds", source="fixed") == [45.0]
    assert h.histogram_values("armed_ttl_seconds", source="fitted") == []
    assert h.program("a")["status"] == "acting"  # type: ignore[index]
    h.tick(0.2 + 44.9)
    assert h.program("a")["state"] == "active"  # type: ignore[index]
    h.tick(0.2 + 45.0)
    assert h.program("a")["state"] == "paused"  # type: ignore[index]
    hinted = h.at(50.0).arrive("a", 20_000, kv_retention_ttl_seconds=2.0)
    h.at(50.5).complete(hinted, prompt=20_000)
    assert h.histogram_values("armed_ttl_seconds", source="request_hint") == [2.0]


def test_ttl_expiry_records_segment_rounds(harness: Any) -> None:
    h: Harness = harness()
    continuous_rounds(h, "a", 3)
    h.tick(h.now + 1000.0)
    rolling = h.rank()["rolling"]
    assert rolling["ttl_pause_samples"] == 1
    assert h.scheduler.parts.stats.of(T0).ttl_pause_rounds() == [3]
    assert h.program("a")["rounds_since_ttl_pause"] == 0  # type: ignore[index]


# ------------------------------------------------------------------------------------------- repair
def test_capacity_repair_pauses_acting_and_marks_reasoning(harness: Any) -> None:
    h: Harness = harness(token_capacity_per_dp_rank=1000, high_watermark_ratio=0.8, low_watermark_ratio=0.5)
    a = h.arrive("a", 100, kv_retention_ttl_seconds=1000.0)
    h.at(1.0).complete(a, prompt=100)  # a: Active+Acting, 200 tokens
    b = h.at(2.0).arrive("b", 100)  # b: Active+Reasoning, 200 tokens
    assert h.dispatched(b)
    h.at(3.0).observe({T0: BackendObservation(0.9, 1, 0)})  # vLLM sees 900 + a's 200 acting
    h.tick()
    assert h.transitions("capacity_repair") == [T0]
    assert h.transitions("capacity_repair_mark") == [T0]
    assert h.program("a")["state"] == "paused"  # type: ignore[index]
    assert h.program("b")["pause_when_idle"] is True  # type: ignore[index]
    h.tick(3.5)
    assert h.transitions("capacity_repair_mark") == [T0]  # committed relief is not marked again
    h.at(4.0).complete(b, prompt=100)
    assert h.transitions("capacity_repair") == [T0, T0]
    assert h.program("b")["pause_reason"] == "capacity_repair"  # type: ignore[index]


def test_marked_program_continuation_does_not_double_count_growth(harness: Any) -> None:
    h: Harness = harness(token_capacity_per_dp_rank=1000, high_watermark_ratio=0.8, low_watermark_ratio=0.5)
    b = h.arrive("b", 100)
    h.at(1.0).observe({T0: BackendObservation(0.95, 1, 0)})
    h.tick()
    assert h.program("b")["pause_when_idle"] is True  # type: ignore[index]
    before = h.rank()["active_program_token_delta_since_observation"]
    h.arrive("b", 300)  # a continuation of the marked Program, with a larger context
    assert h.rank()["active_program_token_delta_since_observation"] == before
    h.at(2.0).complete(b, prompt=100)
    assert h.program("b")["state"] == "active"  # still one request in flight


# --------------------------------------------------------------------------------------- retention
def test_paused_retention_releases_idle_paused_programs(harness: Any) -> None:
    h: Harness = harness(paused_retention_ttl_seconds=10.0)
    a = h.arrive("a")
    h.at(1.0).complete(a)
    assert h.scheduler.next_deadline() == pytest.approx(11.0)
    h.tick(10.9)
    assert h.program("a") is not None
    h.tick(11.0)
    assert h.program("a") is None
    assert h.transitions("paused_retention_release") == [T0]
    again = h.at(12.0).arrive("a")
    assert again.generation == 1


def test_paused_program_with_a_waiter_is_not_released(harness: Any) -> None:
    h: Harness = harness(paused_retention_ttl_seconds=10.0, max_active_programs_per_target=1)
    a = h.arrive("a")
    h.at(1.0).complete(a)
    h.arrive("z", kv_retention_ttl_seconds=1000.0)
    waiting = h.at(2.0).arrive("a")
    h.tick(20.0)
    assert h.program("a") is not None and not h.dispatched(waiting)


# ------------------------------------------------------------------------------------- shared prefix
def test_missing_cached_usage_never_becomes_shared_prefix_evidence(harness: Any) -> None:
    h: Harness = harness()
    a = h.arrive("a", 1000)
    h.at(1.0).complete(a, prompt=1000, cached=None)
    program = h.program("a")
    assert program is not None and program["shared_prefix_tokens"] == 0
    assert not h.histogram_values("shared_prefix_observed_tokens")


def test_shared_prefix_from_the_first_request_of_a_segment_lowers_demand(harness: Any) -> None:
    h: Harness = harness()
    a = h.arrive("a", 1000)
    h.at(1.0).complete(a, prompt=1000, cached=400)
    program = h.program("a")
    assert program is not None
    assert program["shared_prefix_tokens"] == 400
    assert program["shared_prefix_freshness_remaining_seconds"] == pytest.approx(100.0)  # warm-up lifetime
    assert h.histogram_values("shared_prefix_observed_tokens", target=T0) == [400]
    h.at(2.0).arrive("a", 1000)
    assert h.events("program_admit")[-1]["required_tokens"] == 1000 - 400 + 100


def test_low_hit_without_a_placement_restart_keeps_the_segment(harness: Any) -> None:
    h: Harness = harness()
    first = h.arrive("a", 100, kv_retention_ttl_seconds=100.0)
    h.at(1.0).complete(first, prompt=100, cached=20)
    second = h.at(2.0).arrive("a", 200, kv_retention_ttl_seconds=100.0)
    h.at(3.0).complete(second, prompt=200, cached=10)  # 10 < 0.9 × 100: a discontinuity, same placement
    program = h.program("a")
    assert program is not None
    assert program["segment_served_rounds"] == 2
    assert program["shared_prefix_tokens"] == 20
    [event] = h.events("unexpected_cache_discontinuity")
    assert event["previous_context_tokens"] == 100 and event["cached_tokens"] == 10
    assert program["rounds_since_activation"] == 1  # only the continuous round counts


# ------------------------------------------------------------------------------------------ fairness
def test_force_deadline_uses_the_static_fallback_before_the_window_matures(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1, force_resume_timeout_seconds=300.0)
    h.arrive("z", kv_retention_ttl_seconds=10_000.0)
    waiting = h.at(1.0).arrive("a")
    program = h.program("a")
    assert program is not None
    assert program["force_resume_timeout_seconds"] == 300.0
    assert program["force_resume_remaining_seconds"] == pytest.approx(300.0)
    assert h.scheduler.next_deadline() == pytest.approx(301.0)
    h.tick(301.0)
    assert h.dispatched(waiting)
    assert h.transitions("force_resume") == [T0]


def test_force_deadline_is_workload_derived_once_mature(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1, stats_window_size=3)
    h.arrive("z", kv_retention_ttl_seconds=10_000.0)
    # 3 samples, 1 s apart: throughput 1 req/s; rounds 2 → target rounds 4
    mature_window(h, T0, [sample(rounds=2, at=float(i)) for i in range(3)])
    h.at(5.0).arrive("a")
    program = h.program("a")
    assert program is not None
    # z is Acting with 0 rounds: remaining 4; nobody ahead: 3 × 4 / 1 = 12 s, clamped up to 30 s
    assert program["force_resume_active_remaining_rounds"] == 4
    assert program["force_resume_timeout_seconds"] == pytest.approx(30.0)


def test_no_program_starves_past_its_force_deadline(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=2, force_resume_timeout_seconds=30.0)
    for p in ("x", "y"):
        h.arrive(p, kv_retention_ttl_seconds=10_000.0)
    starving = [h.at(1.0 + i).arrive(f"w{i}") for i in range(3)]
    h.tick(30.9)
    assert not any(h.dispatched(s) for s in starving)
    h.tick(31.0)
    assert h.dispatched(starving[0])
    # one Program past the Rank's limits at a time: each next overdue waiter when the previous one leaves
    for t, (done, waiting) in zip((32.0, 33.0), itertools.pairwise(starving), strict=True):
        h.tick(t)
        assert not h.dispatched(waiting)
        h.complete(done)
        assert h.dispatched(waiting)
    assert h.transitions("force_resume") == [T0, T0, T0]


def test_force_deadline_survives_losing_and_regaining_every_rank(harness: Any) -> None:
    h: Harness = harness(
        token_capacity_per_dp_rank=1500, low_watermark_ratio=0.6, force_resume_timeout_seconds=5.0
    )
    h.arrive("p", 50)  # admitted at once (its force timer, due at 5, stays registered)
    h.at(2.0).set_ranks([T1])  # fails over
    waiting = h.arrive("p", 801)  # 901 tokens > 900: queued, force deadline 7
    h.at(4.0).set_ranks([])  # unbound: out of every queue
    h.at(5.0).set_ranks([T1])  # queued again, deadline kept
    h.tick(6.9)
    assert not h.dispatched(waiting)
    h.tick(7.0)
    assert h.dispatched(waiting) and h.transitions("force_resume") == [T1]


# ---------------------------------------------------------------------------------------- observation
def test_observation_checkpoint_keeps_decisions_made_during_the_scrape(harness: Any) -> None:
    h: Harness = harness(token_capacity_per_dp_rank=1000, decode_buffer_tokens=0)
    epoch = h.scheduler.begin_observation(0.0)
    h.arrive("a", 50)  # +50 committed while the scrape is in flight
    h.scheduler.apply_observations(0.5, epoch, {T0: BackendObservation(0.5, 0, 0)})
    rank = h.rank()
    assert rank["router_estimated_used_tokens"] == pytest.approx(550.0)
    assert rank["capacity_accounting_source"] == "backend_observation"
    assert rank["vllm_usage_scaled_tokens"] == pytest.approx(500.0)


def test_observation_scales_reasoning_usage_by_the_router_count(harness: Any) -> None:
    h: Harness = harness(token_capacity_per_dp_rank=1000)
    h.arrive("a", 100)
    h.arrive("b", 100)
    h.at(1.0).observe({T0: BackendObservation(0.2, 1, 0)})  # vLLM runs 1, the router knows 2
    assert h.rank()["observed_active_program_tokens"] == pytest.approx(400.0)


def test_stale_epoch_cannot_restore_a_removed_target(harness: Any) -> None:
    h: Harness = harness(targets=[T0, T1], token_capacity_per_dp_rank=1000)
    epoch = h.scheduler.begin_observation(0.0)
    h.set_ranks([T0])
    h.scheduler.apply_observations(
        0.5, epoch, {T0: BackendObservation(0.5, 0, 0), T1: BackendObservation(0.5, 0, 0)}
    )
    assert [r["target_id"] for r in h.diagnostics()["ranks"]] == [T0]
    assert h.rank(T0)["capacity_accounting_source"] == "router_ledger_missing_observation"
    assert len(h.events("stale_capacity_observation_dropped")) == 1
    epoch = h.scheduler.begin_observation(1.0)
    h.set_ranks([T0])  # unchanged: the epoch stays valid
    h.set_ranks([T1])
    h.set_ranks([T0, T1])  # remove then re-add: still a different snapshot
    h.scheduler.apply_observations(1.5, epoch, {T1: BackendObservation(0.5, 0, 0)})
    assert h.rank(T1)["observation_age_seconds"] is None


def test_accounting_source_diagnostics(harness: Any) -> None:
    h: Harness = harness(token_capacity_per_dp_rank=1000, metrics_interval_seconds=1.0)
    assert h.rank()["capacity_accounting_source"] == "router_ledger_missing_observation"
    h.at(1.0).observe({T0: BackendObservation(0.1, 0, 0)})
    assert h.rank()["capacity_accounting_source"] == "backend_observation"
    h.at(5.0)
    rank = h.rank()
    assert rank["capacity_accounting_source"] == "router_ledger_stale_observation"
    assert rank["observation_age_seconds"] == pytest.approx(4.0) and rank["observation_fresh"] is False
    no_capacity: Harness = harness()
    no_capacity.observe({T0: BackendObservation(0.1, 0, 0)})
    assert no_capacity.rank()["capacity_accounting_source"] == "router_ledger_missing_token_estimate"


def test_fallback_and_recovery_are_logged_once_per_change(harness: Any) -> None:
    h: Harness = harness(token_capacity_per_dp_rank=1000)
    h.tick(0.5)
    for t in (1.0, 2.0, 3.0):
        h.at(t).observe({T0: BackendObservation(0.1, 0, 0)})
        h.tick()
    assert len(h.events("capacity_observation_recovered")) == 1
    for t in (4.0, 5.0, 6.0, 7.0, 8.0):
        h.tick(t)
    fallbacks = h.events("capacity_observation_fallback")
    assert len(fallbacks) == 1
    assert fallbacks[0]["source"] == "router_ledger_stale_observation"
    assert fallbacks[0]["freshness_threshold_seconds"] == 3.0
    assert [lvl for lvl, n, _ in h.observer.events if n == "capacity_observation_fallback"] == ["warning"]
    h.at(9.0).observe({T0: BackendObservation(0.1, 0, 0)})
    h.tick()
    h.tick(9.5)
    assert len(h.events("capacity_observation_recovered")) == 2
    assert len(h.events("capacity_observation_fallback")) == 1


# ------------------------------------------------------------------------------------------ global queue
def global_harness(harness: Any, resume_order: str, **fields: Any) -> Harness:
    """``fields``: more scheduling config."""
    h: Harness = harness(
        global_queue=True,
        resume_order=resume_order,
        binding_strategy="program_round_robin",
        max_active_programs_per_target=1,
        stats_window_size=2,
        admission_waiting_request_threshold=0,
        **fields,
    )
    for i, p in enumerate(("a", "b")):  # a and b run once on T0 and pause (a finishes first)
        handle = h.at(1.0 + i).arrive(p)
        h.complete(handle)
    h.arrive("x", kv_retention_ttl_seconds=10_000.0)  # x keeps T0's only slot
    h.set_ranks([T0, T1])
    mature_window(h, T1, [sample(at=float(i)) for i in range(2)])
    return h


@pytest.mark.parametrize("resume_order", ["mru", "fcfs"])
def test_cross_rank_resume_is_fcfs(harness: Any, resume_order: str) -> None:
    h = global_harness(harness, resume_order)
    a = h.at(10.0).arrive("a")
    b = h.at(10.2).arrive("b")  # b finished last: first in MRU order, second in FCFS order
    h.tick(10.9)
    assert not h.dispatched(a) and not h.dispatched(b)  # neither has waited one interval yet
    h.tick(11.3)
    assert h.dispatched(a) and h.target_of(a) == T1
    assert not h.dispatched(b)  # T1 now holds its one Program
    assert h.transitions("cross_rank_resume") == [T1]


def test_new_program_stays_on_its_initial_binding(harness: Any) -> None:
    h = global_harness(harness, "mru")
    new = h.at(10.0).arrive("never-ran")
    for t in (12.0, 14.0, 16.0):
        h.tick(t)
    assert not h.dispatched(new)
    assert h.program("never-ran")["last_target"] == T0  # type: ignore[index]


def test_global_queue_resumes_locally_first(harness: Any) -> None:
    h = global_harness(harness, "mru")
    a = h.at(10.0).arrive("a")
    x = next(d for d in h.dispatches.values() if d.program.program_id == "x")
    h.at(10.5).complete(x.handle, prompt=100)  # x pauses? no: long TTL keeps it Active+Acting
    h.tick(20_000.0)  # x's TTL is over: a resumes at home, not across
    assert h.dispatched(a) and h.target_of(a) == T0


# ------------------------------------------------------------------------------------------------- timers
def test_timers_do_not_pile_up_over_many_pauses(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1)
    for i in range(500):
        handle = h.at(h.now + 0.1).arrive("a", kv_retention_ttl_seconds=None if i % 2 else 0.05)
        h.at(h.now + 0.1).complete(handle)
    h.tick(h.now + 1.0)  # (the continuity window matured on the way: the last TTL was fitted, now expired)
    program = h.scheduler.parts.table.get(POOL, "a")
    assert program is not None and program.paused_at is not None
    paused_at = program.paused_at
    assert len(h.scheduler.parts.timers) <= 3, len(h.scheduler.parts.timers)
    early = h.scheduler.next_deadline()  # the first pause's entry: it wakes early and re-arms
    assert early is not None and early <= paused_at + 1800.0
    h.tick(early)
    assert h.program("a") is not None
    assert h.scheduler.next_deadline() == pytest.approx(paused_at + 1800.0)
    h.tick(paused_at + 1800.0)
    assert h.program("a") is None


def test_a_released_program_is_let_go_by_the_timers_at_once(harness: Any) -> None:
    """Capped retention releases Programs whose retention entries fall due half an hour later: the heap
    keeps those entries until then, but not the Programs (nor any released one), and they fire for nobody."""
    h: Harness = harness(max_paused_programs=2, max_active_programs_per_target=1)
    for i in range(20):
        handle = h.at(h.now + 0.1).arrive(f"p{i}", kv_retention_ttl_seconds=0.0)
        h.at(h.now + 0.1).complete(handle)  # pauses at once; past two idle Paused, the oldest is released
    core = h.scheduler
    held = list(core.parts.timers._programs.values())
    assert len(held) == 2 and all(core.parts.table.lookup(p.ref) is p for p in held)
    assert len(core.parts.timers) >= 20  # the released Programs' entries are still queued (as serials)
    payloads = list(core.parts.timers._payloads.values())
    assert not [p for p in payloads if isinstance(p, Program) and core.parts.table.lookup(p.ref) is not p]
    h.tick(h.now + 1801.0)
    assert len(core.parts.table) == 0 and not core.parts.timers._programs and not core.parts.timers._due


def test_an_expiring_observation_is_a_deadline(harness: Any) -> None:
    h: Harness = harness()
    h.at(1.0).observe({T0: BackendObservation(0.1, 1, 1)})
    waiting = h.arrive("a")
    assert not h.dispatched(waiting)  # gated
    assert h.scheduler.next_deadline() == pytest.approx(4.0)
    h.tick(h.scheduler.next_deadline())
    assert h.dispatched(waiting)  # the gate lifted exactly when the observation went stale
