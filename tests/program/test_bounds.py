"""Bounds a client cannot lift: the KV-retention hint cap and forced resumes past a Rank's limits."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import T0, Harness
from progrouter.program.types import BackendObservation, PoolFull


def test_kv_retention_hint_is_capped(harness: Any) -> None:
    h: Harness = harness(max_kv_retention_ttl_seconds=30.0)
    a = h.arrive("a", kv_retention_ttl_seconds=1e308)
    h.at(1.0).complete(a, prompt=100)
    assert h.histogram_values("armed_ttl_seconds", source="request_hint") == [30.0]
    assert h.scheduler.next_deadline() == pytest.approx(31.0)
    h.tick(31.0)
    assert h.program("a")["state"] == "paused"  # type: ignore[index]
    assert h.rank()["router_ledger_tokens"] == 0


def test_kv_retention_hint_below_the_cap_is_kept(harness: Any) -> None:
    h: Harness = harness(max_kv_retention_ttl_seconds=30.0)
    a = h.arrive("a", kv_retention_ttl_seconds=12.0)
    h.at(1.0).complete(a, prompt=100)
    assert h.histogram_values("armed_ttl_seconds", source="request_hint") == [12.0]


def _holder(h: Harness, program_id: str, tokens: int) -> None:
    """An Active Program pinned for the whole test (Acting with a long hint)."""
    a = h.arrive(program_id, tokens, kv_retention_ttl_seconds=50.0)
    h.complete(a, prompt=tokens)


def test_a_shared_force_deadline_admits_one_waiter_past_the_limits_at_a_time(harness: Any) -> None:
    h: Harness = harness(
        token_capacity_per_dp_rank=1000,
        max_active_programs_per_target=2,
        force_resume_timeout_seconds=10.0,
        max_kv_retention_ttl_seconds=1000.0,
        decode_buffer_tokens=0,
    )
    _holder(h, "x", 400)
    _holder(h, "y", 400)
    waiting = [h.arrive(f"w{i}", 300) for i in range(50)]
    assert not any(h.dispatched(w) for w in waiting)
    h.tick(10.0)  # every waiter is overdue at once
    admitted = [w for w in waiting if h.dispatched(w)]
    assert len(admitted) == 1
    _within_one_overflow(h.rank(), 300)
    assert h.rank()["router_forced_past_limits"] is True
    assert h.transitions("force_resume") == [T0]
    # as Programs leave, the overdue waiters go, never more than one past the limits; nobody starves
    done: set[int] = set()
    while len(done) < len(waiting):
        h.at(h.now + 1.0)
        running = [w for w in waiting if h.dispatched(w) and w.id not in done]
        assert running, "an overdue waiter starved"
        h.complete(running[0])
        done.add(running[0].id)
        _within_one_overflow(h.rank(), 300)


def _within_one_overflow(rank: dict[str, Any], demand: int) -> None:
    """The Rank's limits (2 Programs, 1000 tokens) exceeded by at most one forced Program's demand."""
    assert rank["router_active_programs"] <= 2 + 1
    assert rank["router_ledger_tokens"] <= 1000 + demand


def test_a_full_pool_refuses_a_request_that_would_wait_and_changes_nothing(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1, max_pooled_requests=3)
    first = h.arrive("a")
    waiting = [h.arrive(f"w{i}") for i in range(3)]
    assert not any(h.dispatched(w) for w in waiting)
    before = h.diagnostics()
    with pytest.raises(PoolFull) as refused:
        h.arrive("late")
    assert refused.value.status == 429
    with pytest.raises(PoolFull):
        h.arrive("w0")  # a waiting Program's second request would wait too
    assert h.diagnostics() == before
    again = h.arrive("a")  # the Active Program's next request never waits: it is not refused
    assert h.dispatched(again)
    h.complete(first)
    h.complete(again)  # a pauses; w0 is admitted and leaves the pool: room again
    assert h.dispatched(waiting[0])
    assert not h.dispatched(h.arrive("late"))


def test_distinct_programs_leave_bounded_state(harness: Any) -> None:
    """Paused Programs past the cap are released oldest first; lineage, generation fence and timer heap
    stay as large as the live set (plus the fence), however many distinct Programs come and go."""
    h: Harness = harness(max_paused_programs=10, paused_retention_ttl_seconds=1800.0)
    core = h.scheduler
    for i in range(500):
        handle = h.at(float(i)).arrive(f"p{i}")
        h.complete(handle)  # fitted TTL 0: Paused at once, retained for 1800 s but for the cap
        assert len(core.parts.table) <= 10 + 1
        assert len(core.parts.lineage) == len(core.parts.table)
        assert core.parts.table.fenced <= 10
        parts = core.parts
        assert len(parts.timers) <= 2 * 4 * (len(parts.table) + len(parts.fleet.targets)) + 1024
    assert h.program("p0") is None and h.program("p489") is None  # the oldest went first
    assert h.program("p490") is not None and h.program("p499") is not None
    assert len(h.transitions("paused_retention_release")) == 490
    again = h.at(600.0).arrive("p499")  # a retained Program continues its generation
    assert h.dispatched(again) and again.generation == 0
    h.complete(again)
    returning = h.at(601.0).arrive("p480")  # released and still fenced: the next generation
    assert returning.generation == 1


def test_a_new_model_pool_over_known_ranks_keeps_the_scrape_valid(harness: Any) -> None:
    h: Harness = harness(token_capacity_per_dp_rank=1000)
    h.arrive("a", 100)
    epoch = h.scheduler.begin_observation(0.0)
    for i in range(50):  # a client naming fresh models: new pools, same Ranks
        h.set_ranks([T0], pool=f"program:model:fresh-{i}")
    h.at(0.5)
    h.scheduler.apply_observations(0.5, epoch, {T0: BackendObservation(0.5, 1, 0)})
    assert not h.events("stale_capacity_observation_dropped")
    assert h.rank()["observation_fresh"] is True
