"""Each scheduling formula against hand-computed values (spec upstream-behavior §3.5–§3.15, §4.3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from progrouter.config import DecodeThroughputModel, PrefillCostModel, ProgramSchedulingConfig
from progrouter.program.core.factors import ContinuitySample, LogNormalFit, RankFactors, RequestSample
from progrouter.program.formulas.accounting import (
    CapacityAccountingSource,
    capacity_accounting_source,
    estimate_active_program_tokens,
    observation_fresh,
    rank_usage,
)
from progrouter.program.formulas.batch_gain import BatchGainEstimate, estimate_batch_gain, rank_batch_gain
from progrouter.program.formulas.force_resume import (
    ForceResumeEstimate,
    PoolThroughput,
    active_remaining_rounds,
    effective_force_resume_timeout,
    force_resume_timeout,
    global_force_resume_estimate,
    local_force_resume_estimate,
    total_active_remaining_rounds,
)
from progrouter.program.formulas.freshness import shared_prefix_freshness_seconds
from progrouter.program.formulas.growth import (
    cache_continuous,
    context_growth,
    growth_reserve,
    private_tokens,
    protected_remaining_rounds,
    target_rounds,
)
from progrouter.program.formulas.repair import (
    RepairVictim,
    plan_capacity_repair,
    projected_usage,
    repair_average_completion,
    repair_relief,
    repair_score,
)
from progrouter.program.formulas.ttl_fit import (
    _ERFC_IS_TWO,
    _SQRT1_2,
    MIN_ACTING_TTL_SECONDS,
    _grid_argmax,
    _no_candidate_gains,
    acting_ttl_candidates,
    completion_cache_miss_impact,
    fit_log_normal,
    fitted_acting_ttl,
    fitted_acting_ttl_for_rank,
    fitted_acting_ttl_from_fit,
    normal_cdf,
)

pytestmark = pytest.mark.timeout(60)


def mature_factors(window: int = 2, *, rounds: int = 3, growth: int | None = 1000) -> RankFactors:
    f = RankFactors(window)
    for i in range(window):
        f.push_request(
            RequestSample(
                prompt_tokens=10_000,
                completion_tokens=100,
                cached_prompt_tokens=9_000,
                context_growth_tokens=growth,
                e2e_seconds=2.0,
                decode_seconds=1.0,
                queue_seconds=0.0,
                rounds_since_ttl_pause=rounds,
                finished_at=float(i),
            )
        )
    return f


# --------------------------------------------------------------------------------------- cost models


def test_reference_cold_prefill_is_13_93_seconds_and_impact_is_1_85_times_it() -> None:
    model = ProgramSchedulingConfig().prefill_cost_model
    prefill = model.prefill_seconds(50_000)
    # 0.066 + 0.05702·50 + 0.0044057·50² = 0.066 + 2.851 + 11.0143
    assert prefill == pytest.approx(13.93, abs=0.005)
    assert model.cache_miss_impact_seconds(50_000) == pytest.approx(1.85 * prefill)
    assert completion_cache_miss_impact(model, 50_000, 0) == pytest.approx(1.85 * prefill)
    # The shared prefix is assumed to survive: only the rest is charged; it is capped at the prompt.
    assert completion_cache_miss_impact(model, 60_000, 10_000) == pytest.approx(1.85 * prefill)
    assert completion_cache_miss_impact(model, 1000, 5000) == 0.0


# --------------------------------------------------------------------------------------- normal CDF


def test_normal_cdf_matches_the_exact_cdf() -> None:
    xs = np.linspace(-8.0, 8.0, 1601)
    ours = np.array([normal_cdf(float(x)) for x in xs])
    assert np.max(np.abs(ours - stats.norm.cdf(xs))) < 1e-12
    assert normal_cdf(0.0) == pytest.approx(0.5, abs=1e-9)
    assert normal_cdf(1.0) + normal_cdf(-1.0) == pytest.approx(1.0, abs=1e-12)
    assert 0.0 <= normal_cdf(-40.0) <= normal_cdf(40.0) == 1.0


# --------------------------------------------------------------------------------------- Progress-TTL


def lognormal_quantile_sample(mu: float, sigma: float, n: int = 100) -> list[float]:
    """A deterministic sample whose log has mean ≈ mu and population std ≈ sigma."""
    return [float(math.exp(mu + sigma * stats.norm.ppf((i + 0.5) / n))) for i in range(n)]


def exact_utility(d: float, impact: float, mu: float, sigma: float) -> float:
    """U(d) = C·P(T<d) − E[T; T<d] − d·P(T≥d), integrated numerically (independent of the closed form)."""
    if d <= 0:
        return 0.0
    dist = stats.lognorm(s=sigma, scale=math.exp(mu))
    partial_mean, _ = integrate.quad(lambda t: t * dist.pdf(t), 0.0, d, limit=200)
    return float(impact * dist.cdf(d) - partial_mean - d * dist.sf(d))


def test_fitted_ttl_on_a_known_interval_sample_is_the_argmax_of_the_true_utility() -> None:
    intervals = lognormal_quantile_sample(mu=0.5, sigma=2.0)  # heavy-tailed tool gaps, median 1.65 s
    logs = np.log(intervals)
    mu, sigma = float(logs.mean()), float(logs.std())
    impact = 6.0
    ttl = fitted_acting_ttl(intervals, impact, 10.0, window_complete=True)

    # Independently: the same upstream candidate grid, scored with the exact utility.
    grid = [0.0, 0.05, 6.0, *np.geomspace(0.05, 6.0, 32)]
    utilities = [exact_utility(float(d), impact, mu, sigma) for d in grid]
    expected = float(grid[int(np.argmax(utilities))])
    assert ttl == pytest.approx(expected, rel=1e-9)
    assert 3.0 < ttl < 3.5  # an interior optimum: neither the floor nor the cap

    # And it sits within one grid step of the continuous optimum, where the hazard rate equals 1/C.
    dist = stats.lognorm(s=sigma, scale=math.exp(mu))
    dense = np.geomspace(0.01, 6.0, 4000)
    # U'(d) = C·f(d) − (1 − F(d)) changes sign once; the maximiser is the last d with U' > 0.
    positive = dense[impact * dist.pdf(dense) - dist.sf(dense) > 0.0]
    optimum = float(positive.max())
    step = (6.0 / 0.05) ** (1 / 31)
    assert optimum / step <= ttl <= optimum * step
    assert exact_utility(ttl, impact, mu, sigma) > 0.0


def test_the_no_gain_bound_answers_exactly_what_the_grid_answers() -> None:
    """The fitted TTL skips the 35-point grid when a bound says no candidate gains (U(d) < 0 for every d):
    over a seeded sweep around the boundary (tool gaps from far shorter to far longer than the cold start)
    the answer equals the grid's every time; the bound is taken often, and the sweep reaches cases where
    the grid finds a gain although C·h < 2·min TTL·(1 − h): a bound four times looser than the one used
    would answer those 0, wrongly."""
    rng = np.random.default_rng(12)
    taken = close = 0
    for _ in range(4_000):
        impact = float(10 ** rng.uniform(-2.0, 1.5))
        cap = float(rng.choice([10.0, 30.0, 600.0, impact * 0.5]))
        fit = LogNormalFit(
            mu=math.log(impact) + float(rng.uniform(-3.0, 6.0)),
            sigma=float(10 ** rng.uniform(-6.0, 0.7)),
            samples=100,
        )
        ttl = fitted_acting_ttl_from_fit(fit, impact, cap, window_complete=True)
        max_ttl = min(cap, impact)
        grid = _grid_argmax(fit, impact, max_ttl)
        assert ttl == grid, (fit, impact, cap)
        if _no_candidate_gains(fit, impact, max_ttl):
            taken += 1
            assert grid == 0.0
        elif grid > 0.0:
            z = (math.log(max_ttl) - fit.mu) / fit.sigma
            hit = normal_cdf(z)
            close += impact * hit < 2.0 * min(MIN_ACTING_TTL_SECONDS, max_ttl) * (1.0 - hit)
    assert taken > 1_000
    assert close > 5


def _grid_scored_point_by_point(fit: LogNormalFit, impact: float, max_ttl: float) -> float:
    """The grid's argmax as it was computed before the shortcuts: every candidate, in order, scored."""
    best_ttl, best_utility = 0.0, 0.0
    for ttl in acting_ttl_candidates(max_ttl):
        if ttl <= 0.0:
            continue
        z = (math.log(ttl) - fit.mu) / fit.sigma
        hit = 0.5 * math.erfc(-z * _SQRT1_2)
        utility = impact * hit - fit.mean * 0.5 * math.erfc(-(z - fit.sigma) * _SQRT1_2)
        utility -= ttl * (1.0 - hit)
        if utility >= best_utility:
            best_ttl, best_utility = ttl, utility
    return best_ttl


def test_intervals_far_inside_the_shortest_ttl_answer_what_the_grid_answers() -> None:
    """When every tool gap returns far within the shortest candidate (both erfc terms exactly 2.0 at every
    point), the grid's answer is its last point (or 0) without scoring it: over a seeded sweep across that
    boundary (z at the shortest candidate from 2 to 20, σ from 1e-6 to 2, and gaps about as long as the
    cold start) the answer equals the grid scored point by point; both sides are reached often."""
    rng = np.random.default_rng(7)
    taken = scored = 0
    for _ in range(4_000):
        impact = float(10 ** rng.uniform(-2.0, 1.0))
        max_ttl = min(float(rng.choice([10.0, 600.0, impact * 0.5])), impact)
        sigma = float(10 ** rng.uniform(-6.0, 0.3))
        least = min(math.log(ttl) for ttl in acting_ttl_candidates(max_ttl) if ttl > 0.0)
        mu = least - float(rng.uniform(2.0, 20.0)) * sigma
        if rng.random() < 0.2:  # gaps about as long as the cold start: scored
            mu = math.log(impact) + float(rng.uniform(-1.0, 1.0)) * sigma
        fit = LogNormalFit(mu=mu, sigma=sigma, samples=100)
        assert _grid_argmax(fit, impact, max_ttl) == _grid_scored_point_by_point(fit, impact, max_ttl)
        if -((least - mu) / sigma - sigma) * _SQRT1_2 <= _ERFC_IS_TWO:
            taken += 1
        else:
            scored += 1
    assert math.erfc(_ERFC_IS_TWO) == 2.0
    assert taken > 1_000 and scored > 1_000


def test_fitted_ttl_is_zero_until_the_continuity_window_is_complete() -> None:
    intervals = lognormal_quantile_sample(mu=-1.0, sigma=0.5)
    assert fitted_acting_ttl(intervals, 6.0, 10.0, window_complete=False) == 0.0
    assert fitted_acting_ttl(intervals, 6.0, 10.0, window_complete=True) > 0.0
    f = RankFactors(100)
    for interval in intervals[:99]:
        f.push_continuity(ContinuitySample(interval, 6.0))
    assert fitted_acting_ttl_for_rank(f, 6.0, 10.0) == 0.0
    f.push_continuity(ContinuitySample(intervals[99], 6.0))
    assert fitted_acting_ttl_for_rank(f, 6.0, 10.0) == pytest.approx(
        fitted_acting_ttl(intervals, 6.0, 10.0, window_complete=True), rel=1e-9
    )
    assert fitted_acting_ttl_for_rank(None, 6.0, 10.0) == 0.0


def test_intervals_far_longer_than_the_impact_give_zero_ttl() -> None:
    intervals = lognormal_quantile_sample(mu=math.log(600.0), sigma=0.3)  # ~10-minute tool gaps
    assert fitted_acting_ttl(intervals, 6.0, 10.0, window_complete=True) == 0.0


def test_intervals_much_shorter_than_the_impact_hold_for_min_of_max_and_impact() -> None:
    intervals = lognormal_quantile_sample(mu=math.log(0.2), sigma=0.2)
    # capped by the impact
    assert fitted_acting_ttl(intervals, 3.0, 10.0, window_complete=True) == pytest.approx(3.0)
    # capped by max_acting_ttl
    assert fitted_acting_ttl(intervals, 6.0, 2.0, window_complete=True) == pytest.approx(2.0)


def test_fitted_ttl_degenerate_inputs() -> None:
    same = [0.5] * 100  # σ = 0 → floored at 1e-6, still fits
    assert fitted_acting_ttl(same, 6.0, 10.0, window_complete=True) == pytest.approx(6.0)
    assert fitted_acting_ttl([0.0, -1.0, math.nan], 6.0, 10.0, window_complete=True) == 0.0
    assert fitted_acting_ttl(same, 0.0, 10.0, window_complete=True) == 0.0
    assert fitted_acting_ttl(same, 6.0, 0.0, window_complete=True) == 0.0
    fit = fit_log_normal(same)
    assert fit is not None and fit.sigma == 1e-6


def test_ttl_candidate_grid_is_upstreams() -> None:
    grid = acting_ttl_candidates(10.0)
    assert len(grid) == 35
    assert grid[:3] == (0.0, 0.05, 10.0)
    assert grid[3] == pytest.approx(0.05) and grid[-1] == pytest.approx(10.0)
    assert acting_ttl_candidates(0.01) == (0.0, 0.01, 0.01)


# --------------------------------------------------------------------------------------- rounds and reserve


def test_growth_reserve_9000_example() -> None:
    f = mature_factors(rounds=3, growth=1000)
    rounds = target_rounds(f, 14)
    assert rounds == 6
    remaining = [protected_remaining_rounds(rounds, r) for r in (4, 5, 9)]
    assert remaining == [2, 1, 0]
    assert growth_reserve(f.average_context_growth_tokens(), rounds, remaining) == 9000.0


def test_target_rounds_clamps_and_cold_window_gives_zero() -> None:
    assert target_rounds(RankFactors(2), 14) == 0
    assert target_rounds(None, 14) == 0
    assert target_rounds(mature_factors(rounds=10), 14) == 14
    assert target_rounds(mature_factors(rounds=0), 14) == 1
    assert growth_reserve(1000.0, 0, [3]) == 0.0
    assert growth_reserve(0.0, 6, [3]) == 0.0


# --------------------------------------------------------------------------------------- batch gain

DECODE = DecodeThroughputModel()
PREFILL = PrefillCostModel()


def gain(**overrides: object) -> BatchGainEstimate:
    args: dict[str, object] = {
        "decode_model": DECODE,
        "prefill_model": PREFILL,
        "enabled": True,
        "low_watermark_tokens": 100_000.0,
        "request_window_complete": True,
        "batch_size_before": 4,
        "context_tokens_before": 200_000,
        "candidate_context_tokens": 10_000,
        "candidate_shared_prefix_tokens": 9_000,
        "avg_decode_seconds": 10.0,
        "avg_completion_tokens": 500.0,
        "avg_context_growth_tokens": 0.0,
        "target_rounds": 6,
        "used_tokens": 50_000.0,
        "required_tokens": 10_000.0,
        "protected_remaining_rounds": [],
        "protected_cache_miss_impacts": [],
    }
    args.update(overrides)
    return estimate_batch_gain(**args)  # type: ignore[arg-type]


def hand_rel_gain() -> float:
    step4 = 0.010635218423115973 + 4 * 0.0004192803698834784 + 200_000 * 1.420458414996201e-7
    step5 = 0.010635218423115973 + 5 * 0.0004192803698834784 + 210_000 * 1.420458414996201e-7
    return (5 / step5) / (4 / step4) - 1.0


def test_batch_gain_admits_when_decode_gain_covers_a_cheap_recovery() -> None:
    est = gain()
    assert est.rel_gain == pytest.approx(hand_rel_gain())
    assert est.rel_gain == pytest.approx(0.196, abs=0.001)
    assert est.batch_gain_seconds == pytest.approx(10.0 * hand_rel_gain())
    # 1000 uncached tokens: (0.066 + 0.05702 + 0.0044057) × 1.85
    assert est.candidate_recovery_seconds == pytest.approx(0.2358, abs=1e-4)
    assert est.continuity_loss_seconds == 0.0
    assert est.admits


def test_batch_gain_rejects_when_the_candidate_recovery_costs_more() -> None:
    est = gain(candidate_shared_prefix_tokens=0, avg_decode_seconds=5.0)
    # 10k uncached: (0.066 + 0.5702 + 0.44057) × 1.85 ≈ 1.992 s > 5 × 0.196 ≈ 0.98 s
    assert est.candidate_recovery_seconds == pytest.approx(1.992, abs=1e-3)
    assert est.batch_gain_seconds == pytest.approx(5.0 * hand_rel_gain())
    assert not est.admits


def test_batch_gain_decode_time_falls_back_to_completion_over_throughput() -> None:
    est = gain(avg_decode_seconds=None, avg_completion_tokens=500.0)
    step4 = 0.010635218423115973 + 4 * 0.0004192803698834784 + 200_000 * 1.420458414996201e-7
    decode_s = 4 * 500.0 / (4 / step4)
    assert est.batch_gain_seconds == pytest.approx(decode_s * hand_rel_gain())
    assert not gain(avg_decode_seconds=None, avg_completion_tokens=0.0).admits


def test_continuity_loss_finite_infinite_and_zero() -> None:
    protected = {"protected_remaining_rounds": [4.0, 2.0], "protected_cache_miss_impacts": [2.0, 4.0]}
    # remaining = 100k − 80k = 20k; before = min(6, 20) = 6; after = min(6, (20k − 10k − 6k)/1k) = 4
    est = gain(avg_context_growth_tokens=1000.0, used_tokens=80_000.0, **protected)
    assert est.continuity_loss_seconds == pytest.approx((6 - 4) / 4 * 3.0)
    assert est.admits == (est.batch_gain_seconds >= est.candidate_recovery_seconds + 1.5)
    # after ≈ 0 while something was protected → ∞: never admitted, whatever the gain
    est = gain(avg_context_growth_tokens=1000.0, used_tokens=85_000.0, avg_decode_seconds=1e9, **protected)
    assert est.continuity_loss_seconds == math.inf and not est.admits
    # plenty of room: nothing shortened
    est = gain(avg_context_growth_tokens=1000.0, used_tokens=10_000.0, **protected)
    assert est.continuity_loss_seconds == 0.0 and est.admits
    # entries with no remaining rounds do not count as protected
    est = gain(
        avg_context_growth_tokens=1000.0,
        used_tokens=80_000.0,
        protected_remaining_rounds=[4.0, 2.0, 0.0],
        protected_cache_miss_impacts=[2.0, 4.0, 100.0],
    )
    assert est.continuity_loss_seconds == pytest.approx(1.5)


def test_batch_gain_disabled_cases() -> None:
    for overrides in (
        {"enabled": False},
        {"low_watermark_tokens": None},
        {"request_window_complete": False},
        {"batch_size_before": 0},
    ):
        est = gain(**overrides)
        assert not est.admits and est.batch_gain_seconds == 0.0
        assert est.candidate_recovery_seconds == pytest.approx(0.2358, abs=1e-4)
    with pytest.raises(ValueError):
        gain(protected_remaining_rounds=[1.0], protected_cache_miss_impacts=[])


def test_rank_batch_gain_reads_config_and_factors() -> None:
    config = ProgramSchedulingConfig(token_capacity_per_dp_rank=100_000, stats_window_size=2)
    f = mature_factors(rounds=3, growth=None)  # decode 1.0 s measured, no growth
    est = rank_batch_gain(
        config,
        f,
        low_watermark_tokens=100_000 * config.low_watermark_ratio,
        batch_size_before=4,
        context_tokens_before=200_000,
        used_tokens=50_000.0,
        protected_remaining_rounds=[],
        protected_cache_miss_impacts=[],
    ).estimate(10_000, 10_000, 100.0)
    assert est.batch_gain_seconds == pytest.approx(1.0 * hand_rel_gain())
    assert est.candidate_recovery_seconds == 0.0 and est.admits
    no_capacity = ProgramSchedulingConfig(stats_window_size=2)
    est = rank_batch_gain(
        no_capacity,
        f,
        low_watermark_tokens=None,
        batch_size_before=4,
        context_tokens_before=200_000,
        used_tokens=50_000.0,
        protected_remaining_rounds=[],
        protected_cache_miss_impacts=[],
    ).estimate(10_000, 10_000, 100.0)
    assert not est.admits


# --------------------------------------------------------------------------------------- force resume


def test_force_resume_timeout_clamps() -> None:
    assert force_resume_timeout(5, 6, 0.5, 300.0) == pytest.approx(66.0)  # 3 × 11 / 0.5
    assert force_resume_timeout(1, 0, 1.0, 300.0) == 30.0  # 3 s → lower clamp
    assert force_resume_timeout(0, 0, 1.0, 300.0) == 30.0
    assert force_resume_timeout(100, 0, 0.5, 300.0) == 300.0  # 600 s → upper clamp
    assert force_resume_timeout(1, 0, 1.0, 20.0) == 20.0  # min(30, max) when max < 30
    assert force_resume_timeout(5, 6, 0.0, 300.0) == 300.0  # no throughput → fallback
    assert force_resume_timeout(5, 6, 0.5, 300.0, target_rounds=0) == 300.0


def test_local_force_resume_estimate() -> None:
    # target 6; active: reasoning at 2 → 4, reasoning at 9 → floor 1, acting at 9 → floor 0, acting at 1 → 5
    est = local_force_resume_estimate(
        target_rounds=6,
        throughput=0.5,
        active_remaining_rounds=total_active_remaining_rounds(6, [2, 9], [9, 1]),
        waiters_ahead=2,
        max_timeout=300.0,
    )
    assert est.active_remaining_rounds == 10.0
    assert est.pool_remaining_rounds == 12.0
    assert est.timeout_seconds == pytest.approx(3 * 22 / 0.5)
    assert not est.fallback
    cold = local_force_resume_estimate(
        target_rounds=0, throughput=0.5, active_remaining_rounds=1.0, waiters_ahead=1, max_timeout=300.0
    )
    assert cold == ForceResumeEstimate(300.0, 0.0, 0.0, 0.0, True)


def test_global_force_resume_estimate() -> None:
    ranks = {"a": (6, 0.5), "b": (4, 1.0)}
    est = global_force_resume_estimate(
        pool=PoolThroughput.of(ranks.values()),
        active_remaining_rounds=total_active_remaining_rounds(6, [2], [])
        + total_active_remaining_rounds(4, [4], [9]),
        waiters_ahead=3,
        max_timeout=300.0,
    )
    assert est.active_remaining_rounds == 4.0 + 1.0 + 0.0
    assert est.pool_remaining_rounds == 6.0 + 4.0 + 5.0  # each waiter ahead counts the mean rounds, 5
    assert est.request_throughput_per_second == 1.5
    assert est.timeout_seconds == pytest.approx(3 * 20 / 1.5)
    immature = global_force_resume_estimate(
        pool=PoolThroughput.of([(6, 0.5), (0, 0.0)]),
        active_remaining_rounds=0.0,
        waiters_ahead=0,
        max_timeout=300.0,
    )
    assert immature.fallback and immature.timeout_seconds == 300.0


def test_a_deadline_hint_replaces_the_estimate_capped_by_queue_timeout() -> None:
    assert effective_force_resume_timeout(66.0, None, 600.0) == 66.0
    assert effective_force_resume_timeout(66.0, 500.0, 600.0) == 500.0
    assert effective_force_resume_timeout(66.0, 5.0, 600.0) == 5.0
    assert effective_force_resume_timeout(66.0, 900.0, 600.0) == 600.0


def test_active_remaining_floor() -> None:
    assert active_remaining_rounds(6, 8, reasoning=True) == 1.0
    assert active_remaining_rounds(6, 8, reasoning=False) == 0.0
    assert active_remaining_rounds(6, 2, reasoning=False) == 4.0


# --------------------------------------------------------------------------------------- capacity repair


def test_repair_score() -> None:
    assert repair_score(10.0, 25, 100.0) == pytest.approx(20.0)  # 1/√0.25 = 2
    assert repair_score(10.0, 400, 100.0) == pytest.approx(5.0)  # 1/√4 = 0.5
    assert repair_score(10.0, 1600, 100.0) == pytest.approx(5.0)  # 0.25 floored to 0.5
    assert repair_score(10.0, 0, 100.0) == pytest.approx(10_000.0)  # ratio floored at 1e-6
    assert repair_score(10.0, 1, 0.0) == pytest.approx(10.0)  # avg_prompt floored at 1
    assert repair_score(0.0, 25, 100.0) == 0.0


def test_projected_usage_and_plan() -> None:
    assert projected_usage(1000.0, 50.0, 3, 200.0, 1) == pytest.approx(900.0)
    assert projected_usage(100.0, 0.0, 0, 500.0, 1) == 0.0
    f = mature_factors()
    f.push_request(
        RequestSample(1, 151, 0, None, 1.0, None, 0.0, 0, 5.0)
    )  # completions 100, 151 → mean 125.5 → 126
    assert repair_average_completion(f) == 126.0
    assert repair_average_completion(None) == 0.0

    victims = [
        RepairVictim("b", reasoning=False, score=5.0, private_tokens=300.0),
        RepairVictim("a", reasoning=True, score=5.0, private_tokens=300.0),
        RepairVictim("c", reasoning=False, score=9.0, private_tokens=100.0),
        RepairVictim("d", reasoning=False, score=5.0, private_tokens=400.0),
    ]
    # not above high: nothing
    assert plan_capacity_repair(1000.0, 1000.0, 800.0, victims, 50.0) == []
    chosen = plan_capacity_repair(1200.0, 1000.0, 800.0, victims, 50.0)
    # c (score 9) → 1100, d (400 private) → 700 ≤ low: stop
    assert [v.program_id for v in chosen] == ["c", "d"]
    chosen = plan_capacity_repair(1600.0, 1000.0, 800.0, victims, 50.0)
    # c → 1500, d → 1100, a (reasoning: 300 + 50, tie on score/private broken by id) → 750
    assert [v.program_id for v in chosen] == ["c", "d", "a"]
    assert repair_relief(300.0, reasoning=True, avg_completion_tokens=50.0) == 350.0


# --------------------------------------------------------------------------------------- freshness


def test_shared_prefix_freshness() -> None:
    # 2 × 100k × 3 s / 4 programs / 1000 uncached tokens = 150 s
    assert shared_prefix_freshness_seconds(100.0, 2.0, 100_000, 3.0, 4, 1000.0, True) == 150.0
    assert shared_prefix_freshness_seconds(100.0, 2.0, 100_000, 3.0, 4, 1000.0, False) == 100.0
    assert shared_prefix_freshness_seconds(100.0, 2.0, None, 3.0, 4, 1000.0, True) == 100.0
    assert shared_prefix_freshness_seconds(100.0, 2.0, 100_000, 3.0, 0, 1000.0, True) == 100.0
    assert shared_prefix_freshness_seconds(100.0, 2.0, 100_000, 0.0, 4, 1000.0, True) == 100.0
    assert shared_prefix_freshness_seconds(100.0, 2.0, 100_000, 3.0, 4, 0.0, True) == 100.0


# --------------------------------------------------------------------------------------- observations


def test_observation_checkpoint_550_example() -> None:
    est = estimate_active_program_tokens(0.5, 1000, 1, 1, 300.0, 0.0)
    assert est == 500.0
    assert (
        rank_usage(fresh=True, est_active_program_tokens=est, delta_since_checkpoint=50.0, ledger_tokens=0)
        == 550.0
    )


def test_active_program_token_estimate_cases() -> None:
    # vLLM runs 2, the Router has 4 reasoning Programs: scale the native usage up, add the acting ledger
    assert estimate_active_program_tokens(0.25, 1000, 2, 4, 0.0, 70.0) == 250.0 * 4 / 2 + 70.0
    # nothing running but the Router has reasoning Programs: trust their private tokens
    assert estimate_active_program_tokens(0.25, 1000, 0, 3, 420.0, 70.0) == 490.0
    # nothing anywhere: native usage
    assert estimate_active_program_tokens(0.25, 1000, 0, 0, 0.0, 0.0) == 250.0
    assert estimate_active_program_tokens(0.25, None, 2, 4, 0.0, 70.0) is None


def test_target_usage_falls_back_to_the_ledger() -> None:
    assert (
        rank_usage(
            fresh=False, est_active_program_tokens=500.0, delta_since_checkpoint=50.0, ledger_tokens=321.0
        )
        == 321.0
    )
    assert (
        rank_usage(
            fresh=True, est_active_program_tokens=None, delta_since_checkpoint=50.0, ledger_tokens=321.0
        )
        == 321.0
    )
    assert (
        rank_usage(
            fresh=True, est_active_program_tokens=100.0, delta_since_checkpoint=-500.0, ledger_tokens=321.0
        )
        == 0.0
    )
    assert observation_fresh(3.0, 1.0) and not observation_fresh(4.0, 1.0)
    src = capacity_accounting_source
    assert src(has_observation=False, fresh=False, has_token_estimate=False) is (
        CapacityAccountingSource.ROUTER_LEDGER_MISSING_OBSERVATION
    )
    assert (
        src(has_observation=True, fresh=False, has_token_estimate=True).value
        == "router_ledger_stale_observation"
    )
    assert src(has_observation=True, fresh=True, has_token_estimate=False).value == (
        "router_ledger_missing_token_estimate"
    )
    assert src(has_observation=True, fresh=True, has_token_estimate=True).value == "backend_observation"


# --------------------------------------------------------------------------------------- bookkeeping


def test_context_growth_continuity_and_private_tokens() -> None:
    assert context_growth(1500, 1000) == 500
    assert context_growth(2500, 1000) is None  # growth ≥ previous: a new context, not growth
    assert context_growth(900, 1000) is None
    assert context_growth(1500, None) is None
    assert cache_continuous(None, 0)
    assert cache_continuous(1000, 900) and not cache_continuous(1000, 899)

    def private(context: int, shared: int, expected: int | None) -> int:
        return private_tokens(
            context,
            shared,
            expected_output_tokens=expected,
            output_token_reservation=None,
            decode_buffer_tokens=100,
        )

    assert private(100, 0, 200) == 300  # upstream's expected_output_length test
    assert private(100, 0, None) == 200
    assert private(100, 150, None) == 100
    assert (
        private_tokens(
            100, 20, expected_output_tokens=None, output_token_reservation=0, decode_buffer_tokens=100
        )
        == 80
    )
