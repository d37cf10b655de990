"""``"token_capacity_per_dp_rank": "auto"``: each Rank's token capacity is the KV size its vLLM reports, per
Rank, followed at runtime; a Rank of unknown size admits by the Program-count guard alone."""

from __future__ import annotations

from typing import Any

import pytest
from tests.program.conftest import T0, T1, Harness

from progrouter.config import ConfigError, ProgramSchedulingConfig, parse_config
from progrouter.program.core.rank_capacity import RankCapacities, TokenCapacitySource
from progrouter.program.types import BackendObservation

UNKNOWN = "unknown (count guard)"


def sized(tokens: int, usage: float = 0.0, running: int = 0) -> BackendObservation:
    """A scrape of a Rank whose vLLM reports ``tokens`` of KV (``vllm:cache_config_info``)."""
    return BackendObservation(usage, running, 0, kv_capacity_tokens=tokens)


def active(h: Harness, target: str) -> int:
    return int(h.rank(target)["router_active_programs"])


def queued(h: Harness, target: str) -> int:
    return int(h.rank(target)["router_queued_programs"])


# ------------------------------------------------------------------------------------------- the table
def test_the_table_answers_each_source() -> None:
    configured, unset, auto = RankCapacities(1000), RankCapacities(None), RankCapacities("auto")
    assert (configured.of(T0), configured.source(T0)) == (1000, TokenCapacitySource.CONFIGURED)
    assert (unset.of(T0), unset.source(T0)) == (None, TokenCapacitySource.UNSET)
    assert (auto.of(T0), auto.source(T0).value) == (None, UNKNOWN)
    assert not configured.report(T0, 500) and configured.of(T0) == 1000  # reports change only "auto"
    assert not unset.report(T0, 500) and unset.of(T0) is None
    assert not auto.report(T0, 0) and not auto.report(T0, -16)  # no size
    assert auto.report(T0, 500) and (auto.of(T0), auto.source(T0)) == (500, TokenCapacitySource.REPORTED)
    assert not auto.report(T0, 500)  # the same size again: no change
    assert auto.report(T0, 800) and auto.of(T0) == 800
    assert auto.of(T1) is None  # per Rank
    auto.forget(T0)
    assert (auto.of(T0), auto.source(T0).value) == (None, UNKNOWN)


# ------------------------------------------------------------------------------------------ admission
def test_an_unknown_rank_admits_by_the_count_guard_then_by_its_reported_size(harness: Any) -> None:
    h: Harness = harness(token_capacity_per_dp_rank="auto", max_active_programs_per_target=3)
    assert (h.rank()["token_capacity"], h.rank()["token_capacity_source"]) == (None, UNKNOWN)
    assert h.rank()["configured_token_capacity"] == "auto"
    handles = [h.arrive(p, 5000) for p in "abcd"]  # 4 × 5100 tokens: only the count guard refuses
    assert [h.dispatched(x) for x in handles] == [True, True, True, False]
    for x in handles[:3]:
        h.at(h.now + 1.0).complete(x, prompt=5000, terminate=True)
    assert h.dispatched(handles[3])
    h.at(h.now + 1.0).complete(handles[3], prompt=5000, terminate=True)
    h.at(h.now + 1.0).observe({T0: sized(2000)})
    entry = h.rank()
    assert (entry["token_capacity"], entry["token_capacity_source"]) == (2000, "reported")
    assert entry["router_estimated_headroom_tokens"] == pytest.approx(2000.0)  # low watermark 1.0, none used
    assert [e["tokens"] for e in h.events("token_capacity_reported")] == [2000]
    e, f = h.arrive("e", 1000), h.arrive("f", 1000)  # 1100 each: the second does not fit
    assert h.dispatched(e) and not h.dispatched(f)
    assert h.histogram_values("admission_capacity_pressure_ratio", target=T0)[-1] == pytest.approx(0.0)


def test_each_rank_admits_by_its_own_size(harness: Any) -> None:
    """Two Ranks reporting 1000 and 4000 tokens; round-robin homes, no cross-Rank resume: with 400-token
    demands the small Rank holds two Programs (800 ≤ 1000 < 1200), the large one all four."""
    h: Harness = harness(
        [T0, T1],
        token_capacity_per_dp_rank="auto",
        binding_strategy="program_round_robin",
        decode_buffer_tokens=0,
    )
    h.observe({T0: sized(1000), T1: sized(4000)})
    handles = [h.arrive(f"p{i}", 400) for i in range(8)]
    assert sorted(h.target_of(x) for x in handles if h.dispatched(x)) == [T0] * 2 + [T1] * 4
    assert (active(h, T0), queued(h, T0), active(h, T1), queued(h, T1)) == (2, 2, 4, 0)
    assert [h.rank(t)["token_capacity"] for t in (T0, T1)] == [1000, 4000]
    h.tick()
    assert [h.observer.gauges[("token_capacity_tokens", (("target", t),))] for t in (T0, T1)] == [1000, 4000]


def test_a_larger_report_admits_the_waiters_at_once(harness: Any) -> None:
    h: Harness = harness(token_capacity_per_dp_rank="auto", decode_buffer_tokens=0, low_watermark_ratio=0.5)
    h.observe({T0: sized(1000)})  # admission fills to 500 tokens
    a, b = h.arrive("a", 500), h.arrive("b", 500)
    assert h.dispatched(a) and not h.dispatched(b)
    h.at(1.0).observe({T0: sized(2000, usage=0.25, running=1)})  # the worker came back with more KV
    assert h.dispatched(b)
    assert [(e["tokens"], e["previous"]) for e in h.events("token_capacity_reported")] == [
        (1000, None),
        (2000, 1000),
    ]


def test_a_size_that_shrinks_below_use_is_repaired_and_loses_nothing(harness: Any) -> None:
    """A worker restarts with a quarter of the KV while Programs hold it: capacity repair pauses the idle
    Acting Program and marks the Reasoning one, the waiter stays queued, and once everything completes the
    ledger is empty and every request was served."""
    h: Harness = harness(
        token_capacity_per_dp_rank="auto",
        high_watermark_ratio=0.8,
        low_watermark_ratio=0.5,
        decode_buffer_tokens=0,
    )
    h.observe({T0: sized(4000)})
    a = h.arrive("a", 1000, kv_retention_ttl_seconds=1000.0)
    h.at(1.0).complete(a, prompt=1000)  # a: Active and Acting
    b = h.at(2.0).arrive("b", 500)  # b: Active and Reasoning
    assert h.dispatched(b)
    h.tick(10.0)  # the scrape aged out: the ledger's ~1500 tokens count, far below 0.8 × 4000
    assert h.transitions("capacity_repair") == []
    h.scheduler.report_kv_capacity(h.now, T0, 1000)  # ~1500 of 1000: above 800
    h.drain()
    assert h.rank()["token_capacity"] == 1000
    assert h.transitions("capacity_repair") == [T0]  # a paused
    assert h.program("a")["state"] == "paused"  # type: ignore[index]
    assert h.program("b")["pause_when_idle"] is True  # type: ignore[index]
    c = h.arrive("c", 400)  # does not fit the shrunk Rank: it waits, it is not lost
    assert not h.dispatched(c)
    h.at(11.0).complete(b, prompt=500, terminate=True)
    assert h.dispatched(c)
    h.at(12.0).complete(c, prompt=400, terminate=True)
    h.tick(13.0)
    assert h.rank()["router_ledger_tokens"] == 0 and h.rank()["router_active_programs"] == 0
    assert h.timed_out == [] and len(h.dispatches) == 3  # a, b and c: every request was served


def test_a_rank_that_leaves_forgets_its_size_until_it_reports_again(harness: Any) -> None:
    h: Harness = harness([T0, T1], token_capacity_per_dp_rank="auto")
    h.tick()
    assert h.observer.gauges[("token_capacity_tokens", (("target", T0),))] == 0  # none yet: the count guard
    h.observe({T0: sized(1000), T1: sized(3000)})
    h.set_ranks([T1])  # T0's worker left
    assert h.rank(T1)["token_capacity"] == 3000
    h.at(1.0).set_ranks([T0, T1])  # and came back (a restarted worker may have another size)
    assert (h.rank(T0)["token_capacity"], h.rank(T0)["token_capacity_source"]) == (None, UNKNOWN)
    h.at(2.0).observe({T0: sized(1500)})
    assert (h.rank(T0)["token_capacity"], h.rank(T0)["token_capacity_source"]) == (1500, "reported")
    assert h.rank(T1)["token_capacity"] == 3000  # a scrape without T1 keeps T1's size


@pytest.mark.parametrize(
    ("setting", "capacity", "source"), [(1000, 1000, "configured"), (None, None, "unset (count guard)")]
)
def test_the_spec_values_ignore_reports(
    harness: Any, setting: int | None, capacity: int | None, source: str
) -> None:
    h: Harness = harness(token_capacity_per_dp_rank=setting)
    h.observe({T0: sized(64_000)})
    assert (h.rank()["token_capacity"], h.rank()["token_capacity_source"]) == (capacity, source)
    assert h.rank()["configured_token_capacity"] == setting
    assert h.events("token_capacity_reported") == []


def test_reasoning_token_balance_counts_an_unknown_rank_as_no_capacity(harness: Any) -> None:
    """With no size known anywhere the binding balances the accounted tokens; a Rank with a reported size
    and room is preferred to one of unknown size."""
    h: Harness = harness(
        [T0, T1], token_capacity_per_dp_rank="auto", binding_strategy="reasoning_token_balance"
    )
    a, b = h.arrive("a", 500), h.arrive("b", 300)
    assert (h.target_of(a), h.target_of(b)) == (T0, T1)  # tie → T0, then T1 holds fewer tokens
    h.observe({T1: sized(10_000)})
    c, d = h.arrive("c", 100), h.arrive("d", 100)
    assert (h.target_of(c), h.target_of(d)) == (T1, T1)  # T1: 10 000 − 400 free; T0: 0 − 600


# ---------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("value", ["kv", "AUTO", "1000", -5, 0, True, 1.5])
def test_a_bad_value_is_a_clear_error(value: object) -> None:
    with pytest.raises(ConfigError, match='is not a positive integer, "auto" or null'):
        parse_config(ProgramSchedulingConfig, {"token_capacity_per_dp_rank": value}, prefix="program")


def test_auto_is_accepted_with_reasoning_token_balance() -> None:
    config = ProgramSchedulingConfig.model_validate(
        {"token_capacity_per_dp_rank": "auto", "binding_strategy": "reasoning_token_balance"}
    )
    assert config.token_capacity_per_dp_rank == "auto"
    assert config.to_json_dict()["token_capacity_per_dp_rank"] == "auto"
