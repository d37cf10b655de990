"""Residency-aware Program scheduling (``residency_aware``): the scheduler on reports of what Ranks hold."""

from __future__ import annotations

from typing import Any

import pytest
from test_scheduler_lifecycle import global_harness

from conftest import POOL, T0, T1, Harness, identity
from progrouter.config import ProgramSchedulingConfig
from progrouter.program.core.request_pool import RequestHandle
from progrouter.program.outcomes import ProgramRequest
from progrouter.program.residency import ResidencyFacts, held_in_vain, holder
from progrouter.program.types import RequestHints

pytestmark = pytest.mark.timeout(30)
SOURCES = {"kv_event_sources": {"http://w:1": "tcp://127.0.0.1:5557"}}


def arrive(h: Harness, program_id: str, resident: dict[str, int] | None, covered: int = 64) -> RequestHandle:
    """A new request of ``covered`` full-block tokens (100 in all), ``resident`` of them held per Rank."""
    report = None if resident is None else (covered, resident)
    request = ProgramRequest(identity(program_id), RequestHints(), POOL, 100, residency=report)
    handle = h.scheduler.arrive(h.now, request)
    h.drain()
    return handle


def acting_and_waiting(harness: Any, **config: Any) -> tuple[Harness, RequestHandle]:
    """``a`` holds T0's only slot through a 60 s TTL after one request of 1,000 tokens; ``b`` waits."""
    h: Harness = harness(max_active_programs_per_target=1, **config)
    a = h.at(1.0).arrive("a", 1000, kv_retention_ttl_seconds=60.0)
    h.at(2.0).complete(a, prompt=1000)
    b = h.at(3.0).arrive("b")
    assert not h.dispatched(b)
    return h, b


def test_an_acting_program_whose_kv_is_gone_stops_holding_its_rank(harness: Any) -> None:
    h, b = acting_and_waiting(harness, residency_aware=True, **SOURCES)
    h.scheduler.observe_residency(h.at(4.0).now, {(POOL, "a"): (1000, {T0: 0})})
    h.drain()
    assert h.dispatched(b)  # a's 60 s charge protected nothing: it paused and b got the slot
    assert h.transitions("ttl_expired") == [T0]
    assert [e["target"] for e in h.events("residency_ttl_end")] == [T0]
    assert h.program("a")["resident_tokens"] == 0  # type: ignore[index]


@pytest.mark.parametrize(
    ("config", "report"),
    [
        ({"residency_aware": True, **SOURCES}, {T0: 1000}),  # still resident: the TTL holds
        ({"residency_aware": True, **SOURCES}, {T0: 900}),  # 90 %: still a continuous hit
        ({"residency_aware": True, **SOURCES}, {T1: 0}),  # its Rank is unknown: the old behaviour
        ({**SOURCES}, {T0: 0}),  # the switch is off: reports change nothing
    ],
)
def test_the_ttl_holds_unless_a_report_shows_the_kv_gone(
    harness: Any, config: dict[str, Any], report: dict[str, int]
) -> None:
    h, b = acting_and_waiting(harness, **config)
    h.scheduler.observe_residency(h.at(4.0).now, {(POOL, "a"): (1000, report)})
    h.drain()
    assert not h.dispatched(b) and h.transitions("ttl_expired") == []


def test_facts_from_before_the_last_completion_prove_nothing(harness: Any) -> None:
    h, _ = acting_and_waiting(harness, residency_aware=True, **SOURCES)
    program = h.scheduler.parts.table.get(POOL, "a")
    assert program is not None  # finished at 2.0: what a Rank held at 1.5 says nothing of its TTL
    assert not held_in_vain(program, ResidencyFacts({T0: 0}, 1.5, 1000), 0.0)
    assert held_in_vain(program, ResidencyFacts({T0: 0}, 2.0, 1000), 0.0)
    assert held_in_vain(program, ResidencyFacts({T0: 899}, 2.0, 1000), 0.0)  # below a continuous hit's 90 %
    assert not held_in_vain(program, ResidencyFacts({T0: 0}, 2.0, 0), 0.0)  # a prompt shorter than a block
    # Nor what it held within ``settle`` of the finish: the events of the blocks it stored may be on the way.
    assert not held_in_vain(program, ResidencyFacts({T0: 0}, 2.5, 1000), 1.0)
    assert held_in_vain(program, ResidencyFacts({T0: 0}, 3.0, 1000), 1.0)


@pytest.mark.parametrize("miss_seconds", [5.0, 1.0])
def test_a_program_whose_prefix_its_rank_still_holds_waits_there_while_waiting_is_cheaper(
    harness: Any, miss_seconds: float
) -> None:
    h = global_harness(harness, "fcfs", residency_aware=True, **SOURCES)
    a = h.at(10.0).arrive("a")
    b = h.at(10.2).arrive("b")
    program = h.scheduler.parts.table.get(POOL, "a")
    assert program is not None
    program.last_cache_miss_impact_seconds = miss_seconds  # what recomputing its context elsewhere costs
    h.scheduler.observe_residency(
        h.at(10.5).now, {(POOL, "a"): (96, {T0: 96, T1: 0}), (POOL, "b"): (96, {T0: 0})}
    )
    h.drain()
    h.tick(11.3)
    if miss_seconds > 1.3:
        # Without residency a (first in FCFS) moves to T1 (test_cross_rank_resume_is_fcfs); its KV is on T0
        # and a miss would cost it more than it has waited, so b, whose KV is gone, takes T1.
        assert h.dispatched(b) and h.target_of(b) == T1
        assert not h.dispatched(a)
    else:  # a has waited 1.3 s, longer than recomputing takes: it moves, as without residency
        assert h.dispatched(a) and h.target_of(a) == T1
        assert not h.dispatched(b)


def test_a_new_program_binds_to_the_rank_holding_its_prompt(harness: Any) -> None:
    h: Harness = harness([T0, T1], binding_strategy="program_round_robin", residency_aware=True, **SOURCES)
    first = arrive(h, "p", {T0: 0, T1: 64})  # round robin would give T0
    assert h.target_of(first) == T1
    second = arrive(h, "q", {T0: 0, T1: 0})  # nobody holds it: the strategy decides
    assert h.target_of(second) == T0
    third = arrive(h, "r", None)  # a text prompt (no token ids): the strategy decides
    assert h.target_of(third) == T1
    fourth = arrive(h, "s", {T0: 32, T1: 32})  # a system prompt every Rank holds: no reason
    assert h.target_of(fourth) == T0
    fifth = arrive(h, "t", {T0: 0, T1: 48})  # a system prompt only T1 holds yet (75 %): no reason either
    assert h.target_of(fifth) == T1  # (round robin's turn)
    sixth = arrive(h, "u", {T0: 0, T1: 58})  # 58 of 64: a continuous hit's 90 % (a fork, a new id)
    assert h.target_of(sixth) == T1  # round robin would give T0
    assert h.program("p")["resident_tokens"] == 64  # type: ignore[index]
    assert h.program("r")["resident_tokens"] is None  # type: ignore[index]


def test_config_refuses_bad_sources() -> None:
    """(A router without any source is refused by ``RouterConfig``: tests/test_config.py.)"""
    with pytest.raises(ValueError, match="has no kv_event_sources entry"):
        ProgramSchedulingConfig(**SOURCES, kv_event_replay_sources={"http://x:2": "tcp://127.0.0.1:1"})
    with pytest.raises(ValueError, match="must start with tcp:// or ipc://"):
        ProgramSchedulingConfig(kv_event_sources={"http://w:1": "udp://h:1"})
    with pytest.raises(ValueError, match="is not a worker URL"):
        ProgramSchedulingConfig(kv_event_sources={"w:1": "tcp://h:1"})
    with pytest.raises(ValueError):
        ProgramSchedulingConfig(kv_event_block_size=0)


def test_holder_needs_a_lead_over_every_other_rank_and_the_floor() -> None:
    facts = ResidencyFacts({T0: 96, T1: 64}, 0.0)
    assert holder(facts, [T0, T1]) == T0
    assert holder(facts, [T1, T0]) == T0
    assert holder(facts, [T0, T1], floor=96) is None  # no more than its shared prefix
    assert holder(ResidencyFacts({T0: 64, T1: 64}, 0.0), [T0, T1]) is None
    assert holder(ResidencyFacts({T0: 64}, 0.0), [T0, T1]) == T0  # an unknown Rank holds nothing known
    assert holder(None, [T0]) is None
