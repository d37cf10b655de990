"""Idle-first capacity repair: idle Acting Programs go first, longest idle first; the rest keep the spec's
order behind them."""

from __future__ import annotations

from progrouter.program.records import ActingTTL
from progrouter.program.repair_order import idle_first_score


def test_idle_acting_programs_rank_before_reasoning_ones_longest_idle_first() -> None:
    now = 1000.0
    long_idle = idle_first_score(reasoning=False, acting_ttl=ActingTTL(900.0, 1100.0), now=now, spec=5.0)
    just_idle = idle_first_score(reasoning=False, acting_ttl=ActingTTL(999.0, 1010.0), now=now, spec=900.0)
    reasoning = idle_first_score(reasoning=True, acting_ttl=None, now=now, spec=1e6)
    assert long_idle > just_idle > reasoning == 1e6


def test_without_an_acting_ttl_the_spec_score_stands() -> None:
    assert idle_first_score(reasoning=False, acting_ttl=None, now=10.0, spec=3.5) == 3.5
