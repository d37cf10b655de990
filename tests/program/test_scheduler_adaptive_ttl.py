"""The adaptive acting TTL in the scheduler, on a fake clock: an idle Program keeps its KV for as long as
nobody wants it, lets it go at the next check once a waiter it keeps out queues, and never holds past a
waiter's force-resume deadline."""

from __future__ import annotations

from typing import Any

from conftest import T0, Harness


def warmed(h: Harness, program_id: str, context: int) -> None:
    """Five short tool calls: the Rank's continuity window is complete and the Program is idle, held."""
    handle = h.arrive(program_id, context)
    h.at(h.now + 0.2).complete(handle, prompt=context)
    for gap in (0.3, 0.5, 0.7, 0.4, 0.6):
        handle = h.at(h.now + gap).arrive(program_id, context)
        h.at(h.now + 0.2).complete(handle, prompt=context, cached=context - 100)


def state(h: Harness, program_id: str) -> tuple[str, str]:
    program = h.program(program_id)
    assert program is not None
    return program["state"], program["status"]


def test_holds_while_nobody_waits_and_pauses_when_a_waiter_queues(harness: Any) -> None:
    h: Harness = harness(acting_ttl_policy="adaptive", stats_window_size=5, token_capacity_per_dp_rank=60_000)
    warmed(h, "a", 30_000)
    assert state(h, "a") == ("active", "acting")
    warming = len(h.transitions("ttl_expired"))  # the TTL is 0 until the window is complete
    idle_from = h.now
    for step in range(1, 11):  # 50 s of checks: far past every observed gap, and nobody waits
        h.tick(idle_from + 5.0 * step)
        assert state(h, "a") == ("active", "acting")
    assert len(h.transitions("ttl_expired")) == warming
    waiter = h.arrive("b", 40_000)  # does not fit beside a's held 30k tokens
    assert not h.dispatched(waiter)
    h.tick(idle_from + 55.0)  # the next check: a's hold now keeps b out, and a has been away for 55 s
    assert state(h, "a")[0] == "paused"
    assert h.transitions("ttl_expired")[warming:] == [T0]
    assert h.dispatched(waiter)


def test_nobody_waiting_holds_up_to_the_longest_retention_hint(harness: Any) -> None:
    """The router holds no longer on its own than an agent may ask for (``max_kv_retention_ttl_seconds``)."""
    h: Harness = harness(
        acting_ttl_policy="adaptive", stats_window_size=5, token_capacity_per_dp_rank=60_000,
        max_kv_retention_ttl_seconds=20.0,
    )  # fmt: skip
    warmed(h, "a", 30_000)
    idle_from = h.now
    for step in range(1, 4):
        h.tick(idle_from + 5.0 * step)
        assert state(h, "a") == ("active", "acting")
    h.tick(idle_from + 20.0)
    assert state(h, "a")[0] == "paused"


def test_a_waiter_with_room_does_not_end_the_hold(harness: Any) -> None:
    h: Harness = harness(
        acting_ttl_policy="adaptive", stats_window_size=5, token_capacity_per_dp_rank=200_000
    )
    warmed(h, "a", 30_000)
    waiter = h.arrive("b", 40_000)
    assert h.dispatched(waiter)  # it fits: nobody is kept out
    h.tick(h.now + 30.0)
    assert state(h, "a") == ("active", "acting")


def test_the_spec_ttl_lets_go_at_once_where_the_adaptive_one_holds(harness: Any) -> None:
    """The same Program under the spec's default: its fitted TTL ends long before a minute."""
    h: Harness = harness(stats_window_size=5, token_capacity_per_dp_rank=60_000)
    warmed(h, "a", 30_000)
    h.tick(h.now + 60.0)
    assert state(h, "a")[0] == "paused"
