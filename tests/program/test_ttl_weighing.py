"""The weighed acting TTL: the spec's utility when one waiter weighs, free holding when nobody waits, and a
hold that ends once the Program has stayed away long enough for the waiters to be worth more."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from progrouter.program.core.factors import LogNormalFit
from progrouter.program.formulas.ttl_fit import fitted_acting_ttl_from_fit
from progrouter.program.formulas.ttl_weighing import hold_utility, waiting_weight, weighed_hold_seconds

#: Real agents' tool calls: median 13 s, p90 187 s (σ = ln(187/13) / 1.2816).
GAPS = LogNormalFit(mu=math.log(13.0), sigma=math.log(187.0 / 13.0) / 1.2816, samples=100)


@pytest.mark.parametrize("impact", [0.5, 5.0, 8.0, 40.0, 70.0])
def test_one_waiter_from_the_start_is_the_spec_ttl(impact: float) -> None:
    cap = 10.0
    spec = fitted_acting_ttl_from_fit(GAPS, impact, cap, window_complete=True)
    weighed = weighed_hold_seconds(GAPS, impact, 1.0, 0.0, min(cap, impact), window_complete=True)
    assert weighed == pytest.approx(spec, rel=1e-9)


def test_nobody_waiting_holds_to_the_maximum() -> None:
    assert weighed_hold_seconds(GAPS, 30.0, 0.0, 0.0, 120.0, window_complete=True) == 120.0
    assert weighed_hold_seconds(GAPS, 30.0, 0.0, 100.0, 120.0, window_complete=True) == 20.0
    assert weighed_hold_seconds(GAPS, 30.0, 0.0, 120.0, 120.0, window_complete=True) == 0.0


def test_immature_window_or_no_impact_pauses_now() -> None:
    assert weighed_hold_seconds(GAPS, 30.0, 0.0, 0.0, 120.0, window_complete=False) == 0.0
    assert weighed_hold_seconds(None, 30.0, 0.0, 0.0, 120.0, window_complete=True) == 0.0
    assert weighed_hold_seconds(GAPS, 0.0, 0.0, 0.0, 120.0, window_complete=True) == 0.0


def test_a_large_recompute_holds_past_the_spec_cap() -> None:
    """A 114k-token context on the 32B profile costs ~70 s to miss: with one waiter the best hold is ~40 s,
    four times the spec's 10 s cap."""
    hold = weighed_hold_seconds(GAPS, 70.0, 1.0, 0.0, 120.0, window_complete=True)
    assert 25.0 < hold < 60.0


@given(
    impact=st.floats(1.0, 200.0),
    light=st.floats(0.0, 5.0),
    extra=st.floats(0.01, 5.0),
    elapsed=st.floats(0.0, 100.0),
)
def test_more_waiting_work_never_holds_longer(
    impact: float, light: float, extra: float, elapsed: float
) -> None:
    lighter = weighed_hold_seconds(GAPS, impact, light, elapsed, 200.0, window_complete=True)
    heavier = weighed_hold_seconds(GAPS, impact, light + extra, elapsed, 200.0, window_complete=True)
    assert heavier <= lighter + 1e-9


def test_a_long_absence_ends_the_hold() -> None:
    """The gaps' hazard falls with time: past some point one more second is worth less than the waiters'."""
    assert weighed_hold_seconds(GAPS, 70.0, 1.0, 5.0, 120.0, window_complete=True) > 0.0
    assert weighed_hold_seconds(GAPS, 70.0, 1.0, 100.0, 120.0, window_complete=True) == 0.0


def test_the_utility_counts_returns_and_idle_seconds() -> None:
    """A tight log-normal around 10 s: holding 20 s catches nearly every return and idles ~10 s."""
    tight = LogNormalFit(mu=math.log(10.0), sigma=0.01, samples=100)
    assert hold_utility(tight, 50.0, 1.0, 0.0, 20.0) == pytest.approx(50.0 - 10.0, rel=1e-3)
    assert hold_utility(tight, 50.0, 1.0, 0.0, 5.0) == pytest.approx(-5.0, rel=1e-3)
    assert hold_utility(tight, 50.0, 1.0, 5.0, 20.0) == pytest.approx(50.0 - 5.0, rel=1e-3)
    assert hold_utility(tight, 50.0, 1.0, 20.0, 20.0) == 0.0


def test_waiting_weight() -> None:
    assert waiting_weight(2, 10, 4, global_queue=False) == 2.0
    assert waiting_weight(2, 10, 4, global_queue=True) == 2.0 + 8 / 4
    assert waiting_weight(0, 0, 4, global_queue=True) == 0.0
    assert waiting_weight(0, 3, 0, global_queue=True) == 0.0
