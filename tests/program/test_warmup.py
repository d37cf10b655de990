"""The pooled statistics warm-up: the spec's TTL and cross-Rank maturity exactly by default; with
``stats_warmup: "pool"`` a Rank whose own window is incomplete uses every Rank's samples together once they
fill one window."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from progrouter.config import ProgramSchedulingConfig
from progrouter.program.core.factors import ContinuitySample, LogNormalFit, RankStats, RequestSample
from progrouter.program.formulas.ttl_fit import fit_log_normal, fitted_acting_ttl_for_rank, pooled_fit
from progrouter.program.variants import warmup
from progrouter.program.variants.warmup import stats_warmup

WINDOW = 10


@dataclass
class Statistics:
    """What a warm-up reads: the config (which names it) and the per-Rank statistics."""

    config: ProgramSchedulingConfig
    factors: RankStats = field(default_factory=lambda: RankStats(WINDOW))


def continuity_fit(core: Statistics, target: str) -> LogNormalFit | None:
    """The fit the warm-up ``core.config`` names gives ``target``'s acting TTL."""
    return stats_warmup(core.config).continuity_fit(core.factors, target)


def request_stats_mature(core: Statistics, target: str) -> bool:
    return stats_warmup(core.config).request_stats_mature(core.factors, target)


def fitted_ttl(core: Statistics, target: str, impact: float) -> float:
    warm, max_ttl = stats_warmup(core.config), core.config.max_acting_ttl_seconds
    return warmup.fitted_ttl(warm, core.factors, target, impact, max_ttl)


def core_with(samples: dict[str, list[float]], **config: object) -> Statistics:
    core = Statistics(ProgramSchedulingConfig(stats_window_size=WINDOW, **config))
    for target, intervals in samples.items():
        factors = core.factors.of(target)
        for interval in intervals:
            factors.push_continuity(ContinuitySample(interval, 30.0))
    return core


def gaps(n: int, seed: int) -> list[float]:
    """Tool calls like real agents': log-normal, median 13 s, p90 187 s."""
    rng = random.Random(seed)
    return [rng.lognormvariate(math.log(13.0), math.log(187.0 / 13.0) / 1.2816) for _ in range(n)]


@given(st.lists(st.lists(st.floats(0.01, 1e4), max_size=12), min_size=1, max_size=5))
def test_the_pooled_fit_is_the_fit_of_the_union(groups: list[list[float]]) -> None:
    union = [x for g in groups for x in g]
    pooled = pooled_fit(fit_log_normal(g) for g in groups)
    expected = fit_log_normal(union)
    if expected is None:
        assert pooled is None
        return
    assert pooled is not None and pooled.samples == expected.samples
    assert pooled.mu == pytest.approx(expected.mu, rel=1e-9, abs=1e-9)
    assert pooled.sigma == pytest.approx(expected.sigma, rel=1e-6, abs=1e-5)


@pytest.mark.parametrize("impact", [5.0, 30.0, 70.0])
def test_the_default_is_the_spec_ttl(impact: float) -> None:
    """Under ``"spec"`` the TTL is the spec's for a cold Rank (0), a mature one, and a Rank never seen."""
    core = core_with({"a": gaps(WINDOW - 1, 1), "b": gaps(WINDOW, 2), "c": gaps(WINDOW, 3)})
    for target in ("a", "b", "z"):
        spec = fitted_acting_ttl_for_rank(core.factors.get(target), impact, 10.0)
        assert fitted_ttl(core, target, impact) == spec
    assert fitted_ttl(core, "a", impact) == 0.0


def test_a_cold_rank_borrows_the_pool_once_it_fills_one_window() -> None:
    cold = core_with({"a": gaps(3, 1), "b": gaps(WINDOW - 4, 2)}, stats_warmup="pool")
    assert continuity_fit(cold, "a") is None  # 9 samples in all: still 0
    warm = core_with({"a": gaps(3, 1), "b": gaps(WINDOW - 3, 2)}, stats_warmup="pool")
    fit = continuity_fit(warm, "a")
    assert fit is not None and fit.samples == WINDOW
    expected = fit_log_normal(gaps(3, 1) + gaps(WINDOW - 3, 2))
    assert expected is not None and fit.mu == pytest.approx(expected.mu)


def test_a_cold_rank_holds_for_short_tool_calls_seen_elsewhere() -> None:
    """Tool calls of 2–4 s, a 30 s recompute: the spec pauses the cold Rank's Program at once; pooled, it
    holds about as long as the mature Rank next to it."""
    short = [2.0, 3.0, 4.0, 2.5, 3.5, 3.0, 2.0, 4.0, 3.0, 2.5]
    split = {"a": short[:2], "b": short[2:]}
    assert fitted_ttl(core_with(split), "a", 30.0) == 0.0
    pooled = fitted_ttl(core_with(split, stats_warmup="pool"), "a", 30.0)
    mature = fitted_ttl(core_with({"a": short}), "a", 30.0)
    assert pooled == mature > 3.0


def test_a_mature_rank_keeps_its_own_fit() -> None:
    """Pooling is only the warm-up: a Rank with a complete window fits its own samples."""
    core = core_with({"a": [5.0] * WINDOW, "b": [500.0] * WINDOW}, stats_warmup="pool")
    fit = continuity_fit(core, "a")
    assert fit is not None and fit.mu == pytest.approx(math.log(5.0)) and fit.samples == WINDOW


def with_requests(counts: dict[str, int], **config: object) -> Statistics:
    core = core_with({t: [] for t in counts}, **config)
    for target, n in counts.items():
        for _ in range(n):
            core.factors.of(target).push_request(RequestSample(1000, 10, 0, None, 1.0, None, 0.0, 0, 0.0))
    return core


def test_cross_rank_maturity_borrows_the_pool_only_when_switched_on() -> None:
    counts = {"a": 2, "b": WINDOW - 2, "c": WINDOW}
    spec, pooled = with_requests(counts), with_requests(counts, stats_warmup="pool")
    assert [request_stats_mature(spec, t) for t in ("a", "b", "c", "z")] == [
        False,
        False,
        True,
        False,
    ]
    assert [request_stats_mature(pooled, t) for t in ("a", "b", "c", "z")] == [
        True,
        True,
        True,
        False,
    ]
    short = with_requests({"a": 2, "b": WINDOW - 3}, stats_warmup="pool")
    assert not request_stats_mature(short, "a")


def test_the_config_names_the_switch() -> None:
    assert ProgramSchedulingConfig().stats_warmup == "spec"
    with pytest.raises(ValueError, match="stats_warmup"):
        ProgramSchedulingConfig(stats_warmup="rank")
