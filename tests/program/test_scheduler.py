"""ProgramScheduler, issue-4 rules: Programs, RequestPool, binding, admission, completion, ordering."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import POOL, T0, T1, Harness
from progrouter.program.core.state import ProgramRef
from progrouter.program.outcomes import ProgramRequest
from progrouter.program.types import NoTargets, RequestHints

pytestmark = pytest.mark.timeout(30)


def test_first_program_is_admitted_and_dispatched(harness: Any) -> None:
    h: Harness = harness()
    handle = h.arrive("task:lead", 100)
    dispatch = h.dispatches[handle.id]
    assert dispatch.target.id == T0
    assert dispatch.target.headers() == {"X-data-parallel-rank": "0"}
    assert dispatch.placement_start_request
    assert dispatch.program == ProgramRef(POOL, "task:lead", 0)
    assert dispatch.queued_seconds == 0.0
    admit = h.events("program_admit")
    assert len(admit) == 1 and admit[0]["program"] == ProgramRef(POOL, "task:lead", 0).redacted_id()
    assert h.transitions("program_admit") == [T0]
    program = h.program("task:lead")
    assert program is not None
    assert (program["state"], program["status"]) == ("active", "reasoning")


def test_no_targets_raises_and_creates_nothing(harness: Any) -> None:
    h: Harness = harness()
    request = ProgramRequest(h_identity("p"), RequestHints(), "program:model:unknown", 10)
    with pytest.raises(NoTargets) as info:
        h.scheduler.arrive(0.0, request)
    assert info.value.status == 503
    assert h.diagnostics()["programs"] == 0


def h_identity(program_id: str) -> Any:
    from conftest import identity

    return identity(program_id)


def test_active_program_continues_on_its_placement_without_admission(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1)
    first = h.arrive("a")
    second = h.arrive("a")  # concurrent request of the same Program: dispatched at once
    assert h.dispatched(second)
    assert h.dispatches[second.id].placement_epoch == h.dispatches[first.id].placement_epoch
    assert not h.dispatches[second.id].placement_start_request
    assert h.rank()["router_in_flight_requests"] == 2


def test_acting_program_is_not_reclaimed_by_admission(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1)
    a = h.arrive("a", kv_retention_ttl_seconds=5.0)
    h.at(1.0).complete(a, prompt=100)
    assert h.program("a")["status"] == "acting"  # type: ignore[index]
    b = h.arrive("b")
    assert not h.dispatched(b)
    assert h.rank()["router_queued_programs"] == 1
    h.tick(5.9)
    assert not h.dispatched(b)
    h.tick(6.0)  # a's TTL (armed at 1.0 for 5 s) expired: it pauses and b takes the placement
    assert h.transitions("ttl_expired") == [T0]
    assert h.dispatched(b)
    assert h.dispatches[b.id].queued_seconds == pytest.approx(5.0)


def test_expected_output_replaces_the_decode_buffer(harness: Any) -> None:
    h: Harness = harness()
    h.arrive("a", 100, expected_output_tokens=200)
    assert h.events("program_admit")[0]["required_tokens"] == 300
    assert h.rank()["router_ledger_tokens"] == 300
    h2: Harness = harness()
    h2.arrive("a", 100)
    assert h2.events("program_admit")[0]["required_tokens"] == 200  # decode buffer 100


def test_token_capacity_uses_the_low_watermark(harness: Any) -> None:
    h: Harness = harness(token_capacity_per_dp_rank=1000, low_watermark_ratio=0.5, high_watermark_ratio=1.0)
    a = h.arrive("a", 300)  # private 400 <= 500
    b = h.arrive("b", 300)  # 400 + 400 > 500
    assert h.dispatched(a) and not h.dispatched(b)
    h.at(1.0).complete(a, prompt=300)  # immature window: TTL 0, a pauses and frees its 400 tokens
    assert h.dispatched(b)
    assert h.rank()["router_ledger_tokens"] == 400


def test_count_guard_without_token_capacity(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=2)
    handles = [h.arrive(p) for p in ("a", "b", "c")]
    assert [h.dispatched(x) for x in handles] == [True, True, False]
    h.at(1.0).complete(handles[0])
    assert h.dispatched(handles[2])


def test_immediate_pause_when_the_window_is_immature(harness: Any) -> None:
    h: Harness = harness()
    a = h.arrive("a")
    h.at(2.0).complete(a, prompt=100)
    program = h.program("a")
    assert program is not None
    assert (program["state"], program["status"], program["pause_reason"]) == (
        "paused",
        "acting",
        "ttl_expired",
    )
    assert h.histogram_values("armed_ttl_seconds", source="fitted") == [0.0]
    assert h.rank()["router_ledger_tokens"] == 0
    assert h.events("program_pause")[0]["reason"] == "ttl_expired"


def test_kv_retention_ttl_hint_keeps_the_program_active(harness: Any) -> None:
    h: Harness = harness()
    a = h.arrive("a", kv_retention_ttl_seconds=7.0)
    h.at(1.0).complete(a, prompt=100)
    program = h.program("a")
    assert program is not None
    assert (program["state"], program["status"]) == ("active", "acting")
    assert program["ttl_remaining_seconds"] > 6.0
    assert h.histogram_values("armed_ttl_seconds", source="request_hint") == [7.0]
    assert h.scheduler.next_deadline() == pytest.approx(8.0)
    h.tick(7.9)
    assert h.program("a")["state"] == "active"  # type: ignore[index]
    h.tick(8.0)
    assert h.program("a")["state"] == "paused"  # type: ignore[index]


def test_next_arrival_during_ttl_dispatches_immediately_on_the_same_rank(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1)
    a = h.arrive("a", kv_retention_ttl_seconds=5.0)
    h.at(1.0).complete(a, prompt=100)
    again = h.at(2.0).arrive("a", 150)
    assert h.dispatched(again)
    assert not h.dispatches[again.id].placement_start_request
    assert h.dispatches[again.id].placement_epoch == h.dispatches[a.id].placement_epoch


def test_failed_completion_pauses_with_request_failed(harness: Any) -> None:
    h: Harness = harness()
    a = h.arrive("a", kv_retention_ttl_seconds=5.0)
    h.at(1.0).complete(a, success=False)
    assert h.transitions("request_failed") == [T0]
    assert h.program("a")["pause_reason"] == "request_failed"  # type: ignore[index]


def test_completion_counts_exactly_once(harness: Any) -> None:
    h: Harness = harness()
    a = h.arrive("a", kv_retention_ttl_seconds=5.0)
    b = h.arrive("a")
    h.at(1.0).complete(a, prompt=100)
    h.complete(a, prompt=100)  # a duplicate is ignored: b is still in flight
    program = h.program("a")
    assert program is not None and program["in_flight_requests"] == 1
    assert program["status"] == "reasoning"
    h.complete(b, prompt=100)
    assert h.program("a")["status"] == "acting"  # type: ignore[index]


def test_terminal_completion_releases_occupancy(harness: Any) -> None:
    h: Harness = harness(token_capacity_per_dp_rank=10_000)
    a = h.arrive("a", 100)
    assert h.rank()["active_program_token_delta_since_observation"] == 200
    h.at(1.0).complete(a, prompt=100, terminate=True)
    rank = h.rank()
    assert rank["active_program_token_delta_since_observation"] == 0
    assert rank["router_ledger_tokens"] == 0
    assert h.program("a") is None
    assert h.diagnostics()["programs"] == 0


def test_context_estimate_grows_at_once_and_shrinks_after_two_lower_observations(harness: Any) -> None:
    h: Harness = harness()

    def round_trip(prompt: int) -> int:
        handle = h.at(h.now + 1).arrive("a", 10, kv_retention_ttl_seconds=100.0)
        h.at(h.now + 1).complete(handle, prompt=prompt)
        return h.program("a")["estimated_context_tokens"]  # type: ignore[index,no-any-return]

    assert round_trip(1000) == 1000
    assert round_trip(800) == 1000  # first lower observation: kept
    assert round_trip(1200) == 1200  # growth resets the shrink count
    assert round_trip(900) == 1200
    assert round_trip(700) == 700  # second consecutive lower observation


def test_cancel_of_an_unstarted_program_releases_it(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1)
    h.arrive("a")
    b = h.arrive("b")
    assert h.diagnostics()["retained_requests"] == 1
    h.at(1.0).cancel(b)
    assert h.program("b") is None
    assert h.diagnostics()["retained_requests"] == 0
    assert h.rank()["router_queued_programs"] == 0
    # the next request of b starts a new generation
    b2 = h.arrive("b")
    assert b2.generation == 1


def test_cancel_of_a_started_program_keeps_it_paused(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1)
    a = h.arrive("a")
    h.at(1.0).complete(a)  # a started (1 completed request) and paused
    blocker = h.arrive("z", kv_retention_ttl_seconds=100.0)
    assert h.dispatched(blocker)
    again = h.at(2.0).arrive("a")
    assert not h.dispatched(again)
    h.cancel(again)
    program = h.program("a")
    assert program is not None and (program["state"], program["status"]) == ("paused", "acting")
    assert h.rank()["router_queued_programs"] == 0


def test_cancel_of_a_dispatched_request_is_a_no_op(harness: Any) -> None:
    h: Harness = harness()
    a = h.arrive("a")
    h.cancel(a)
    assert h.program("a")["in_flight_requests"] == 1  # type: ignore[index]


def test_stale_generation_completion_cannot_touch_the_new_generation(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1)
    a = h.arrive("a")
    h.set_ranks([T1])  # failover: a's in-flight request is forgotten, a rebinds to T1
    assert h.transitions("health_failover") == [T0]
    h.set_ranks([T0, T1])
    b = h.arrive("a")
    assert h.dispatched(b) and h.target_of(b) == T1
    h.complete(a, prompt=5000)  # stale epoch: ignored
    program = h.program("a")
    assert program is not None
    assert program["in_flight_requests"] == 1
    assert program["estimated_context_tokens"] == 100


def test_queue_timeout_of_a_later_request_with_a_short_deadline(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1)
    h.arrive("z", kv_retention_ttl_seconds=1000.0)
    first = h.at(1.0).arrive("a")
    second = h.at(2.0).arrive("a", deadline_seconds=3.0)
    assert h.scheduler.next_deadline() == pytest.approx(5.0)
    h.tick(5.0)
    assert [x.id for x in h.timed_out] == [second.id]
    assert not h.dispatched(first)
    assert h.diagnostics()["retained_requests"] == 1


def test_deadline_turns_into_a_force_resume_not_a_rejection(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1)
    h.arrive("z", kv_retention_ttl_seconds=1000.0)
    a = h.at(1.0).arrive("a", deadline_seconds=4.0)
    program = h.program("a")
    assert program is not None and program["force_resume_timeout_seconds"] == 4.0
    h.tick(5.0)
    assert h.dispatched(a) and not h.timed_out
    assert h.transitions("force_resume") == [T0]
    assert h.rank()["router_active_programs"] == 2  # forced past the count guard


def test_queue_timeout_when_the_waiting_gate_blocks_even_the_force_resume(harness: Any) -> None:
    from progrouter.program.types import BackendObservation

    h: Harness = harness(
        max_active_programs_per_target=1, queue_timeout_seconds=20, force_resume_timeout_seconds=5
    )
    h.arrive("z", kv_retention_ttl_seconds=1000.0)
    a = h.at(1.0).arrive("a")
    for t in range(2, 22):
        h.at(float(t)).observe({T0: BackendObservation(0.1, 1, 3)})
        h.tick()
    assert not h.dispatched(a)
    assert [x.id for x in h.timed_out] == [a.id]
    assert h.program("a") is None  # never started: released with its last request


def test_waiting_gate_needs_a_fresh_observation(harness: Any) -> None:
    from progrouter.program.types import BackendObservation

    h: Harness = harness()
    h.observe({T0: BackendObservation(0.1, 1, 1)})
    a = h.arrive("a")
    assert not h.dispatched(a)  # fresh observation with waiting >= 1: gated
    h.tick(3.0)
    assert not h.dispatched(a)  # 3 s old at a 1 s interval: still fresh
    h.tick(3.5)
    assert h.dispatched(a)  # stale: the gate no longer applies


def test_waiting_gate_disabled_by_zero_threshold(harness: Any) -> None:
    from progrouter.program.types import BackendObservation

    h: Harness = harness(admission_waiting_request_threshold=0)
    h.observe({T0: BackendObservation(0.1, 1, 50)})
    assert h.dispatched(h.arrive("a"))


def test_step_id_omitted_advances(harness: Any) -> None:
    h: Harness = harness()
    first = h.arrive("a", step_id=7, kv_retention_ttl_seconds=100.0)
    h.at(1.0).complete(first)
    h.arrive("a")
    assert h.program("a")["step_id"] == 8  # type: ignore[index]
    h2: Harness = harness()
    h2.arrive("b")
    assert h2.program("b")["step_id"] == 0  # type: ignore[index]


def test_binding_only_bypasses_the_pool_and_admission(harness: Any) -> None:
    h: Harness = harness(binding_only=True, max_active_programs_per_target=1, token_capacity_per_dp_rank=10)
    handles = [h.arrive(p, 500) for p in ("a", "b", "c")]
    assert all(h.dispatched(x) for x in handles)
    assert h.diagnostics()["retained_requests"] == 0
    assert not [n for n, _, _ in h.observer.histograms if n.startswith("admission_")]


def test_info_and_warning_events_never_carry_raw_ids(harness: Any) -> None:
    from progrouter.program.types import BackendObservation

    secret = "secret-task:secret-agent"
    h: Harness = harness(max_active_programs_per_target=1, token_capacity_per_dp_rank=100_000)
    a = h.arrive(secret, kv_retention_ttl_seconds=1.0)
    h.arrive("other")
    h.at(1.0).complete(a, prompt=5000, cached=10)
    again = h.at(1.5).arrive(secret)
    h.observe({T0: BackendObservation(0.5, 1, 0)})
    h.tick(10.0)
    h.complete(again, prompt=6000, cached=0)
    for level, _, fields in h.observer.events:
        if level != "debug":
            assert secret not in repr(fields)
    for _, _, labels in h.observer.histograms:
        assert set(labels) <= {"target", "source", "window", "reason"}
    for name, labels in h.observer.gauges:
        assert {k for k, _ in labels} <= {"target", "window"}, name


# ------------------------------------------------------------------------------------------------ ordering
def _blocked(h: Harness) -> Any:
    """Occupy the single slot until the returned handle completes."""
    return h.arrive("blocker", kv_retention_ttl_seconds=0.0)


def _finish_round(h: Harness, program_id: str, at: float) -> None:
    """Run one request of ``program_id`` to completion (immature window: it pauses right after)."""
    handle = h.at(at).arrive(program_id)
    assert h.dispatched(handle)
    h.complete(handle)


def test_mru_resumes_the_most_recently_finished_program_first(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1)
    _finish_round(h, "old", 1.0)
    _finish_round(h, "new", 2.0)
    blocker = h.at(3.0).arrive("blocker")
    h.arrive("fresh")  # never finished anything: last
    h.at(3.1).arrive("old")
    h.at(3.2).arrive("new")
    h.dispatch_order.clear()
    _drain_in_order(h, blocker, 4.0)
    assert h.dispatch_order == ["new", "old", "fresh"]


def test_fcfs_resumes_by_queue_time(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1, resume_order="fcfs")
    _finish_round(h, "old", 1.0)
    _finish_round(h, "new", 2.0)
    blocker = h.at(3.0).arrive("blocker")
    h.at(3.1).arrive("fresh")
    h.at(3.2).arrive("old")
    h.at(3.3).arrive("new")
    h.dispatch_order.clear()
    _drain_in_order(h, blocker, 4.0)
    assert h.dispatch_order == ["fresh", "old", "new"]


def _drain_in_order(h: Harness, blocker: Any, at: float) -> None:
    h.at(at).complete(blocker)
    done = {blocker.id}
    while True:
        pending = [d for i, d in h.dispatches.items() if i not in done]
        if not pending:
            return
        for dispatch in pending:
            done.add(dispatch.handle.id)
            h.complete(dispatch.handle)


def test_priority_comes_before_recency(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1)
    _finish_round(h, "recent", 1.0)
    blocker = h.at(2.0).arrive("blocker")
    h.arrive("recent")
    h.arrive("important", priority=5)
    h.dispatch_order.clear()
    _drain_in_order(h, blocker, 3.0)
    assert h.dispatch_order == ["important", "recent"]


def test_forced_tier_comes_first(harness: Any) -> None:
    from progrouter.program.types import BackendObservation

    h: Harness = harness(max_active_programs_per_target=2, force_resume_timeout_seconds=2.0)
    h.arrive("x", kv_retention_ttl_seconds=1000.0)  # one of two slots, for good
    h.at(0.5).observe({T0: BackendObservation(0.1, 1, 1)})  # the waiting gate closes the Rank
    h.at(1.0).arrive("urgent")  # forced from 3.0, still gated
    h.at(2.0).arrive("vip", priority=10)  # forced only from 4.0
    h.at(3.0).observe({T0: BackendObservation(0.1, 1, 1)})
    assert h.dispatch_order == ["x"]
    h.at(3.5).observe({T0: BackendObservation(0.1, 1, 0)})  # gate opens: one pass sees both
    assert h.dispatch_order == ["x", "urgent"]  # forced first takes the last slot; vip must wait
    assert h.transitions("force_resume") == [T0]


def test_segment_yield_marker_orders_last_within_a_tier_and_clears_on_resume(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1, max_segment_rounds=1)
    a = h.arrive("a", kv_retention_ttl_seconds=100.0)
    b = h.at(0.5).arrive("b")
    h.at(1.0).complete(a)  # one round reached, a local waiter: a yields
    assert h.transitions("max_segment_yield") == [T0]
    assert h.dispatched(b)
    assert h.program("a")["pause_reason"] == "max_segment_yield"  # type: ignore[index]
    h.at(1.5).arrive("a")
    h.at(1.6).arrive("c")
    h.dispatch_order.clear()
    h.at(2.0).complete(b)  # b (TTL 0) pauses: c (no marker) goes before the yielded a
    assert h.dispatch_order == ["c"]
    c = next(d for d in h.dispatches.values() if d.program.program_id == "c")
    h.at(3.0).complete(c.handle)
    assert h.dispatch_order == ["c", "a"]
    assert h.program("a")["pause_reason"] is None  # type: ignore[index]


def test_priority_beats_the_yield_marker(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1, max_segment_rounds=1)
    a = h.arrive("a", kv_retention_ttl_seconds=100.0)
    b = h.at(0.5).arrive("b")
    h.at(1.0).complete(a)
    h.at(1.5).arrive("a", priority=1)
    h.at(1.6).arrive("c")
    h.dispatch_order.clear()
    h.at(2.0).complete(b)
    assert h.dispatch_order == ["a"]


# ------------------------------------------------------------------------------------------------- binding
def test_consistent_hash_binding_ignores_target_order(harness: Any) -> None:
    targets = [f"http://w:{p}@{r}" for p in (1, 2) for r in (0, 1)]
    forward: Harness = harness(targets=targets)
    backward: Harness = harness(targets=list(reversed(targets)))
    for i in range(20):
        assert forward.target_of(forward.arrive(f"p{i}")) == backward.target_of(backward.arrive(f"p{i}"))
    assert len({forward.target_of(h) for h in map(lambda i: forward.arrive(f"q{i}"), range(40))}) > 1


def test_program_round_robin_walks_sorted_targets(harness: Any) -> None:
    h: Harness = harness(targets=[T1, T0], binding_strategy="program_round_robin")
    assert [h.target_of(h.arrive(p)) for p in "abcd"] == [T0, T1, T0, T1]


def test_least_program_count_counts_active_and_waiting(harness: Any) -> None:
    h: Harness = harness(targets=[T0, T1], binding_strategy="least_program_count")
    a = h.arrive("a")
    b = h.arrive("b")
    assert (h.target_of(a), h.target_of(b)) == (T0, T1)
    c = h.arrive("c")
    assert h.target_of(c) == T0  # tie: smaller id


def test_reasoning_token_balance_picks_the_most_remaining_capacity(harness: Any) -> None:
    h: Harness = harness(
        targets=[T0, T1], binding_strategy="reasoning_token_balance", token_capacity_per_dp_rank=10_000
    )
    big = h.arrive("big", 5000)
    small = h.arrive("small", 100)
    third = h.arrive("third", 100)
    assert (h.target_of(big), h.target_of(small), h.target_of(third)) == (T0, T1, T1)


def test_cache_aware_cold_burst_spreads_across_ranks(harness: Any) -> None:
    h: Harness = harness(targets=[T0, T1], binding_strategy="cache_aware", token_capacity_per_dp_rank=5000)
    text = "You are a helpful coding agent. " * 20
    first = h.arrive("a", 3000, text=text)
    second = h.arrive("b", 3000, text=text)
    assert (h.target_of(first), h.target_of(second)) == (T0, T1)


def test_cache_aware_counts_pending_cold_programs_toward_pressure(harness: Any) -> None:
    from progrouter.program.types import BackendObservation

    h: Harness = harness(targets=[T0, T1], binding_strategy="cache_aware", token_capacity_per_dp_rank=5000)
    h.observe({T0: BackendObservation(0.0, 0, 1), T1: BackendObservation(0.0, 0, 1)})  # both gated
    text = "You are a helpful coding agent. " * 20
    h.arrive("a", 3000, text=text)
    h.arrive("b", 3000, text=text)
    assert not h.dispatches
    assert (h.program("a")["home_target"], h.program("b")["home_target"]) == (T0, T1)  # type: ignore[index]


def test_cache_aware_follows_the_prefix_when_pressure_allows(harness: Any) -> None:
    h: Harness = harness(targets=[T0, T1], binding_strategy="cache_aware", token_capacity_per_dp_rank=100_000)
    shared = "system prompt of the team " * 40
    a = h.arrive("a", 100, text=shared + "task a")
    b = h.arrive("b", 100, text="completely different " * 40)
    c = h.arrive("c", 100, text=shared + "task c")
    assert h.target_of(c) == h.target_of(a)
    assert h.target_of(b) != h.target_of(a)


def test_binding_stays_until_release(harness: Any) -> None:
    h: Harness = harness(targets=[T0, T1], binding_strategy="program_round_robin")
    a = h.arrive("a")
    h.arrive("b")
    h.at(1.0).complete(a)  # a pauses (TTL 0) but keeps its home
    again = h.at(2.0).arrive("a")
    assert h.target_of(again) == T0
    assert h.program("a")["home_target"] == T0  # type: ignore[index]


def test_removed_target_rebinds_with_health_failover(harness: Any) -> None:
    h: Harness = harness(
        targets=[T0, T1], binding_strategy="program_round_robin", max_active_programs_per_target=1
    )
    a = h.arrive("a")  # T0
    h.arrive("b")  # T1
    waiting = h.arrive("c")  # T0, queued behind a
    assert not h.dispatched(waiting)
    h.at(1.0).set_ranks([T1])
    assert h.transitions("health_failover") == [T0, T0]
    diag = h.diagnostics()
    assert [r["target_id"] for r in diag["ranks"]] == [T1]
    program = h.program("a")
    assert program is not None and program["home_target"] == T1 and program["state"] == "paused"
    assert h.program("c")["last_target"] == T1  # type: ignore[index]
    h.complete(a)  # stale: ignored, nothing leaks
    assert h.rank(T1)["router_ledger_tokens"] == 200  # only b


def test_pool_without_targets_keeps_programs_until_targets_return(harness: Any) -> None:
    h: Harness = harness(max_active_programs_per_target=1)
    h.arrive("z", kv_retention_ttl_seconds=100.0)
    waiting = h.arrive("a")
    h.at(1.0).set_ranks([])
    assert h.diagnostics()["retained_requests"] == 1
    with pytest.raises(NoTargets):
        h.arrive("b")
    h.at(2.0).set_ranks([T1])
    assert h.dispatched(waiting) and h.target_of(waiting) == T1
