"""The §5.6 diagnostics snapshot and the gauges published on tick."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from conftest import POOL, T0, T1, Harness
from progrouter.program.core.diagnostics import SHOWN_STATES, redact
from progrouter.program.core.state import Program, ProgramRef, ProgramState, ProgramStatus
from progrouter.program.types import BackendObservation

pytestmark = pytest.mark.timeout(30)

RANK_KEYS = {
    "target_id", "base_url", "dp_rank", "configured_token_capacity", "token_capacity",
    "token_capacity_source", "router_estimated_used_tokens",
    "router_estimated_headroom_tokens", "vllm_usage_scaled_tokens", "observed_active_reasoning_tokens",
    "observed_active_program_tokens", "tracked_active_reasoning_requests",
    "observed_router_active_reasoning_programs", "observed_router_active_reasoning_requests",
    "active_program_token_delta_since_observation", "future_pause_relief_tokens",
    "active_acting_private_tokens",
    "router_minus_vllm_used_tokens", "router_active_programs", "router_active_reasoning_programs",
    "router_active_acting_programs", "router_paused_reasoning_programs", "router_paused_acting_programs",
    "router_in_flight_requests", "router_queued_programs", "router_queued_requests", "vllm_kv_cache_usage",
    "vllm_running_requests", "vllm_waiting_requests", "observation_age_seconds", "observation_fresh",
    "capacity_accounting_source", "rolling", "programs",
}  # fmt: skip
ROLLING_KEYS = {
    "request_samples", "continuity_samples", "ttl_pause_samples", "request_window_complete",
    "continuity_window_complete", "avg_prompt_tokens", "avg_completion_tokens", "avg_cached_prompt_tokens",
    "avg_cached_prompt_ratio", "avg_context_growth_tokens", "avg_e2e_seconds", "avg_decode_seconds",
    "avg_router_queue_seconds", "avg_rounds_since_ttl_pause", "request_throughput_per_second",
    "fitted_acting_ttl_seconds",
}  # fmt: skip
PROGRAM_KEYS = {
    "program", "generation", "state", "status", "expected_resume", "task_id", "session_id", "agent_id",
    "parent_program_id", "root_program_id", "blocks_parent", "agent_role", "spawn_reason", "step_id",
    "request_id", "request_priority", "request_deadline_seconds", "expected_output_tokens",
    "kv_retention_ttl_seconds", "home_target", "last_target", "placement", "estimated_context_tokens",
    "shared_prefix_tokens", "shared_prefix_freshness_remaining_seconds", "logical_tokens", "private_tokens",
    "in_flight_requests", "waiting_requests", "segment_served_rounds", "rounds_since_activation",
    "rounds_since_ttl_pause", "pause_when_idle", "pause_reason", "acting_seconds", "queued_seconds",
    "ttl_remaining_seconds", "force_resume_remaining_seconds", "force_resume_timeout_seconds",
    "force_resume_active_remaining_rounds", "force_resume_pool_remaining_rounds",
    "force_resume_request_throughput_per_second",
}  # fmt: skip


def test_snapshot_exposes_program_and_rank_facts(harness: Any) -> None:
    h: Harness = harness(
        targets=[T0, T1], token_capacity_per_dp_rank=10_000, max_active_programs_per_target=1
    )
    a = h.arrive("team:lead", 400, request_id="r-1", kv_retention_ttl_seconds=3.0)
    h.at(1.0).complete(a, prompt=400, cached=0)
    h.observe({T0: BackendObservation(0.25, 1, 0), T1: BackendObservation(0.0, 0, 0)})
    h.tick()
    snapshot = h.diagnostics()
    json.dumps(snapshot, allow_nan=False)  # JSON-ready
    assert snapshot["enabled"] is True and snapshot["resume_order"] == "mru"
    assert snapshot["global_queue"] is False and snapshot["binding_only"] is False
    assert [r["target_id"] for r in snapshot["ranks"]] == [T0, T1]
    for rank in snapshot["ranks"]:
        assert set(rank) >= RANK_KEYS
        assert set(rank["rolling"]) >= ROLLING_KEYS or rank["rolling"]["request_samples"] == 0
    home = h.program("team:lead")
    assert home is not None and set(home) >= PROGRAM_KEYS
    assert home["program"] == ProgramRef(POOL, "team:lead", 0).redacted_id()
    # client-chosen ids are redacted (raw ids never leave the router), stably: equal ids, equal digests
    assert home["root_program_id"] == redact("team:lead") and "team:lead" not in json.dumps(snapshot)
    assert (home["state"], home["status"], home["request_id"]) == ("active", "acting", redact("r-1"))
    assert "r-1" not in json.dumps(snapshot)
    assert home["ttl_remaining_seconds"] == pytest.approx(3.0)
    rank = h.rank(home["placement"])
    assert rank["router_active_acting_programs"] == 1
    assert rank["capacity_accounting_source"] == "backend_observation"
    assert rank["observation_fresh"] is True


def test_rolling_block_once_samples_exist(harness: Any) -> None:
    h: Harness = harness()
    a = h.arrive("a", 1000)
    h.at(2.0).complete(a, prompt=1000, completion=50, cached=400, decode_seconds=1.5)
    rolling = h.rank()["rolling"]
    assert set(rolling) >= ROLLING_KEYS
    assert rolling["request_samples"] == 1 and rolling["request_window_complete"] is False
    assert rolling["avg_prompt_tokens"] == 1000 and rolling["avg_cached_prompt_ratio"] == pytest.approx(0.4)
    assert rolling["avg_decode_seconds"] == pytest.approx(1.5) and rolling[
        "avg_e2e_seconds"
    ] == pytest.approx(2.0)
    assert rolling["fitted_acting_ttl_seconds"] == 0.0


def test_queued_program_shows_force_resume_and_queue_facts(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1)
    h.arrive("z", kv_retention_ttl_seconds=100.0)
    h.at(1.0).arrive("w", priority=3, deadline_seconds=50.0, expected_output_tokens=70)
    h.at(4.0)
    program = h.program("w")
    assert program is not None
    assert program["queued_seconds"] == pytest.approx(3.0)
    assert program["force_resume_remaining_seconds"] == pytest.approx(47.0)
    assert program["waiting_requests"] == 1 and program["request_priority"] == 3
    assert program["private_tokens"] == 100 + 70
    rank = h.rank()
    assert (rank["router_queued_programs"], rank["router_queued_requests"]) == (1, 1)
    assert rank["router_paused_reasoning_programs"] == 1
    assert h.diagnostics()["retained_requests"] == 1


def test_gauges_are_published_on_tick(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1)
    a = h.arrive("a", kv_retention_ttl_seconds=100.0)
    h.arrive("b")
    h.at(1.0).complete(a)
    h.tick()
    gauges = h.observer.gauges
    assert gauges[("rank_queue_size", (("target", T0),))] == 1
    assert gauges[("rank_active_programs", (("target", T0),))] == 1
    assert gauges[("capacity_observation_fresh", (("target", T0),))] == 0
    assert gauges[("rolling_samples", (("target", T0), ("window", "request")))] == 1
    assert ("fitted_ttl_seconds", (("target", T0),)) in gauges


def test_identity_free_traffic_leaves_no_trace(harness: Any) -> None:
    h: Harness = harness()
    h.tick(1.0)
    snapshot = h.diagnostics()
    assert snapshot["programs"] == 0 and snapshot["retained_requests"] == 0
    assert h.scheduler.tracked_ranks() == []  # nothing to poll until a Program arrives
    h.arrive("a")
    assert [t.id for t in h.scheduler.tracked_ranks()] == [T0]


# ---------------------------------------------------------------------------------------- read-only
def _drive(h: Harness, seed: int, *, look: Callable[[Harness], None] | None) -> list[tuple[str, float, str]]:
    """A seeded mix of arrivals, completions, cancels, observations and ticks over two Ranks under
    pressure; ``look`` runs after every event. Returns what the scheduler decided."""
    rng = random.Random(seed)
    handles: list[Any] = []
    for _ in range(400):
        h.at(h.now + rng.uniform(0.0, 0.4))
        action = rng.random()
        if action < 0.45:
            ttl = rng.choice([None, 0.0, 1.0])
            handles.append(
                h.arrive(f"p{rng.randrange(12)}", rng.randint(100, 900), kv_retention_ttl_seconds=ttl)
            )
        elif action < 0.8:
            done = [x for x in handles if h.dispatched(x)]
            if done:
                handle = done[rng.randrange(len(done))]
                handles.remove(handle)
                prompt = rng.randint(100, 1200)
                h.complete(handle, prompt=prompt, cached=rng.choice([None, prompt // 2, prompt]))
        elif action < 0.85:
            waiting = [x for x in handles if not h.dispatched(x)]
            if waiting:
                handle = waiting[rng.randrange(len(waiting))]
                handles.remove(handle)
                h.cancel(handle)
        elif action < 0.92:
            h.observe({T0: BackendObservation(rng.random(), rng.randint(0, 4), rng.randint(0, 2))})
        else:
            h.tick()
        if look is not None:
            look(h)
    return [
        (pid, d.dispatched_at, d.target.id)
        for pid, d in zip(h.dispatch_order, h.dispatches.values(), strict=True)
    ] + [("timed_out", 0.0, str(handle.id)) for handle in h.timed_out]


def _look_twice(h: Harness) -> None:
    h.diagnostics()
    h.diagnostics()
    h.scheduler.view.counts()
    h.scheduler.view.rows("retained", 0, 5)


def _counts_match_a_scan(h: Harness, seen: Counter[str]) -> None:
    """The counted aggregates (no scan of every Program) equal a scan of every Program; ``seen`` counts
    the cases met."""
    programs = list(h.scheduler.parts.table)
    for rank in h.diagnostics()["ranks"]:
        here = [p for p in programs if p.last_rank == rank["target_id"]]
        statuses = Counter(p.status for p in here if p.state is ProgramState.PAUSED)
        assert rank["router_paused_reasoning_programs"] == statuses[ProgramStatus.REASONING]
        assert rank["router_paused_acting_programs"] == statuses[ProgramStatus.ACTING]
        seen.update(s.value for s in statuses.elements())
    view, pool = h.scheduler.view, h.scheduler.parts.request_pool

    def shown(p: Program) -> str:
        return "running" if p.state is ProgramState.ACTIVE else "pooled" if pool.waiting(p) else "retained"

    for state in SHOWN_STATES:
        rows = view.rows(state, 0, len(programs))
        members = [p for p in programs if shown(p) == state]
        assert sorted(r.program for r in rows) == sorted(p.redacted for p in members)
        assert view.counts()[state] == len(rows)
        waiting = {p.redacted: pool.waiting(p) for p in members}
        assert all(r.state == state and r.pooled_requests == waiting[r.program] for r in rows)
    everyone = view.rows(None, 0, len(programs))  # every Program, in creation order
    assert [r.program for r in everyone] == [p.redacted for p in programs]
    seen.update(state for state in SHOWN_STATES if view.counts()[state])


CONFIG: dict[str, Any] = {
    "token_capacity_per_dp_rank": 3000,
    "max_active_programs_per_target": 4,
    "stats_window_size": 5,
    "admission_waiting_request_threshold": 2,
    "queue_timeout_seconds": 20.0,
    "force_resume_timeout_seconds": 5.0,
}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_counted_aggregates_equal_a_scan_after_every_event(seed: int) -> None:
    h, seen = Harness([T0, T1], **CONFIG), Counter[str]()
    _drive(h, seed, look=lambda h: _counts_match_a_scan(h, seen))
    assert set(seen) == {"reasoning", "acting", *SHOWN_STATES}, seen  # every case was met


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_taking_diagnostics_twice_changes_no_scheduling_outcome(seed: int) -> None:
    quiet, watched = Harness([T0, T1], **CONFIG), Harness([T0, T1], **CONFIG)
    decided = _drive(quiet, seed, look=None)
    assert decided == _drive(watched, seed, look=_look_twice)
    assert len(decided) > 50  # the scenario does decide things
    assert quiet.diagnostics() == watched.diagnostics()
    assert quiet.observer.events == watched.observer.events


def test_programs_are_paged_over_all_ranks(harness: Any) -> None:
    h: Harness = harness(targets=[T0, T1])
    for i in range(30):
        h.complete(h.arrive(f"p{i}"))

    def listed(**page: int) -> list[str]:
        snapshot = h.scheduler.diagnostics(h.now, **page)
        assert snapshot["program_page"]["total"] == 30
        return [p["program"] for rank in snapshot["ranks"] for p in rank["programs"]]

    everything = listed(limit=100)
    assert len(everything) == 30 and len(set(everything)) == 30
    pages = [listed(offset=o, limit=7) for o in range(0, 30, 7)]
    assert [p for page in pages for p in page] == everything  # the pages tile the whole list, in order
    assert listed(offset=30, limit=7) == []
    assert len(listed(limit=10**9)) == 30  # the cap only limits, it never fails
