"""The adaptive acting TTL's rule: a held second priced by the share of the Rank it keeps from the waiters,
holds that shorten as the price rises and lengthen as the recompute grows, and no hold once a waiter's
force-resume deadline is due."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from progrouter.program.core.factors import LogNormalFit
from progrouter.program.formulas.ttl_pricing import adaptive_hold_seconds, hold_price
from progrouter.program.formulas.ttl_weighing import weighed_hold_seconds

#: Real agents' tool calls: median 13 s, p90 187 s (σ = ln(187/13) / 1.2816).
GAPS = LogNormalFit(mu=math.log(13.0), sigma=math.log(187.0 / 13.0) / 1.2816, samples=100)

fits = st.builds(LogNormalFit, mu=st.floats(-1.0, 6.0), sigma=st.floats(0.05, 3.0), samples=st.just(100))
impacts = st.floats(0.0, 300.0)
prices = st.floats(0.0, 20.0)
elapsed = st.floats(0.0, 150.0)
longest = st.floats(1.0, 300.0)


def test_the_price_is_the_waiters_times_the_held_share() -> None:
    assert hold_price(3.0, 100_000, 400_000) == pytest.approx(0.75)
    assert hold_price(3.0, 500_000, 400_000) == 3.0  # never above the whole Rank
    assert hold_price(0.0, 100_000, 400_000) == 0.0  # nobody waits
    assert hold_price(3.0, 100_000, None) == 3.0  # capacity unknown: the weighed weight


def test_a_free_rank_holds_to_the_longest_hold_and_a_crowded_small_rank_does_not() -> None:
    """A 100k-token context on the 8B profile (a miss ~10 s): alone it holds the whole 120 s; with one
    waiter on a Rank where it is a ninth of the KV it still holds through most tool calls (~1 min); with four
    waiters on a Rank it fills a third of (the 32B profile's) it lets go within the spec's 10 s."""
    nobody = hold_price(0.0, 100_000, 900_000)
    free = adaptive_hold_seconds(GAPS, 10.0, nobody, 0.0, 120.0, deadline_due=False)
    large = hold_price(1.0, 100_000, 900_000)
    small = hold_price(4.0, 100_000, 300_000)
    assert free == 120.0
    assert 30.0 < adaptive_hold_seconds(GAPS, 10.0, large, 0.0, 120.0, deadline_due=False) < 120.0
    assert adaptive_hold_seconds(GAPS, 30.0, small, 0.0, 120.0, deadline_due=False) <= 10.0


def test_it_is_the_weighed_ttl_at_the_weighed_weight() -> None:
    for weight in (0.0, 0.3, 1.0, 4.0):
        assert adaptive_hold_seconds(
            GAPS, 40.0, weight, 5.0, 120.0, deadline_due=False
        ) == weighed_hold_seconds(GAPS, 40.0, weight, 5.0, 120.0, window_complete=True)


@given(fit=fits, impact=impacts, price=prices, extra=st.floats(0.0, 10.0), t=elapsed, cap=longest)
def test_a_higher_price_never_holds_longer(
    fit: LogNormalFit, impact: float, price: float, extra: float, t: float, cap: float
) -> None:
    cheap = adaptive_hold_seconds(fit, impact, price, t, cap, deadline_due=False)
    dear = adaptive_hold_seconds(fit, impact, price + extra, t, cap, deadline_due=False)
    assert dear <= cheap + 1e-9


@given(fit=fits, impact=impacts, more=st.floats(0.0, 100.0), price=prices, t=elapsed, cap=longest)
def test_a_costlier_recompute_never_holds_shorter(
    fit: LogNormalFit, impact: float, more: float, price: float, t: float, cap: float
) -> None:
    cheap = adaptive_hold_seconds(fit, impact, price, t, cap, deadline_due=False)
    dear = adaptive_hold_seconds(fit, impact + more, price, t, cap, deadline_due=False)
    assert dear >= cheap - 1e-9


@given(fit=st.none() | fits, impact=impacts, price=prices, t=elapsed, cap=longest)
def test_never_holds_when_a_force_resume_deadline_is_due(
    fit: LogNormalFit | None, impact: float, price: float, t: float, cap: float
) -> None:
    assert adaptive_hold_seconds(fit, impact, price, t, cap, deadline_due=True) == 0.0


@given(
    waiters=st.floats(0.0, 50.0), more=st.floats(0.0, 10.0), held=st.integers(0, 10**6),
    capacity=st.none() | st.integers(1, 10**6),
)  # fmt: skip
def test_the_price_grows_with_the_waiters_and_costs_nothing_without_them(
    waiters: float, more: float, held: int, capacity: int | None
) -> None:
    price = hold_price(waiters, held, capacity)
    assert 0.0 <= price <= waiters
    assert hold_price(waiters + more, held, capacity) >= price
    if waiters == 0.0:
        assert price == 0.0


@given(fit=fits, impact=impacts, price=prices, t=elapsed, cap=longest)
def test_holds_stay_within_the_longest_hold(
    fit: LogNormalFit, impact: float, price: float, t: float, cap: float
) -> None:
    assert (
        0.0
        <= adaptive_hold_seconds(fit, impact, price, t, cap, deadline_due=False)
        <= max(0.0, cap - t) + 1e-9
    )
