"""Rolling per-Rank windows: bounds, averages, throughput and the O(1) log-normal fit."""

from __future__ import annotations

import math
import random

import pytest

from progrouter.program.core.factors import ContinuitySample, RankFactors, RequestSample
from progrouter.program.formulas.ttl_fit import fit_log_normal

pytestmark = pytest.mark.timeout(30)


def sample(
    *,
    prompt: int = 1000,
    completion: int = 100,
    cached: int = 0,
    growth: int | None = None,
    e2e: float = 1.0,
    decode: float | None = None,
    queue: float = 0.0,
    rounds: int = 0,
    finished_at: float = 0.0,
) -> RequestSample:
    return RequestSample(
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_prompt_tokens=cached,
        context_growth_tokens=growth,
        e2e_seconds=e2e,
        decode_seconds=decode,
        queue_seconds=queue,
        rounds_since_ttl_pause=rounds,
        finished_at=finished_at,
    )


def test_empty_factors_fall_back_to_zero() -> None:
    f = RankFactors(3)
    assert not f.request_window_complete()
    assert not f.continuity_window_complete()
    assert f.average_prompt_tokens() == 0.0
    assert f.average_cached_prompt_ratio() == 0.0
    assert f.average_context_growth_tokens() == 0.0
    assert f.average_decode_seconds() is None
    assert f.request_throughput_per_second() == 0.0
    assert f.average_cache_miss_impact_seconds() == 0.0
    assert f.log_normal_fit() is None
    assert f.continuity_intervals() == []


def test_window_is_complete_at_window_size_and_drops_the_oldest_request() -> None:
    f = RankFactors(3)
    for i, prompt in enumerate([100, 200, 300]):
        f.push_request(sample(prompt=prompt, e2e=float(i + 1), finished_at=float(i)))
        assert f.request_window_complete() == (i == 2)
    assert f.average_prompt_tokens() == pytest.approx(200.0)
    assert f.average_e2e_seconds() == pytest.approx(2.0)
    f.push_request(sample(prompt=1000, e2e=10.0, finished_at=3.0))
    assert f.request_sample_count == 3
    assert [s.prompt_tokens for s in f.request_samples()] == [200, 300, 1000]
    assert f.average_prompt_tokens() == pytest.approx(500.0)
    assert f.average_e2e_seconds() == pytest.approx((2.0 + 3.0 + 10.0) / 3)
    assert f.request_window_complete()


def test_cached_ratio_is_token_weighted_not_a_mean_of_ratios() -> None:
    f = RankFactors(10)
    f.push_request(sample(prompt=100, cached=90))  # ratio 0.9
    f.push_request(sample(prompt=900, cached=0))  # ratio 0.0
    # Σcached/Σprompt = 90/1000, whereas the mean of the ratios would be 0.45.
    assert f.average_cached_prompt_ratio() == pytest.approx(0.09)
    assert f.average_cached_prompt_tokens() == pytest.approx(45.0)
    assert f.average_uncached_prompt_tokens() == pytest.approx(455.0)


def test_growth_and_decode_average_only_over_samples_that_have_them() -> None:
    f = RankFactors(2)
    f.push_request(sample(growth=1000, decode=None))
    f.push_request(sample(growth=None, decode=2.0))
    assert f.average_context_growth_tokens() == pytest.approx(1000.0)
    assert f.average_decode_seconds() == pytest.approx(2.0)
    f.push_request(sample(growth=None, decode=4.0))  # evicts the only growth sample
    assert f.average_context_growth_tokens() == 0.0
    assert f.average_decode_seconds() == pytest.approx(3.0)
    f.push_request(sample(growth=300, decode=None))
    f.push_request(sample(growth=500, decode=None))  # no decode measurement left in the window
    assert f.average_decode_seconds() is None
    assert f.average_context_growth_tokens() == pytest.approx(400.0)


def test_throughput_is_samples_minus_one_over_the_span() -> None:
    f = RankFactors(3)
    f.push_request(sample(finished_at=10.0))
    assert f.request_throughput_per_second() == 0.0  # one sample: undefined
    f.push_request(sample(finished_at=10.0))
    assert f.request_throughput_per_second() == 0.0  # zero span: undefined
    f.push_request(sample(finished_at=14.0))
    assert f.request_throughput_per_second() == pytest.approx(2 / 4.0)
    f.push_request(sample(finished_at=15.0))  # window now 10, 14, 15
    assert f.request_throughput_per_second() == pytest.approx(2 / 5.0)


def test_router_queue_and_rounds_averages() -> None:
    f = RankFactors(4)
    for q, r in [(0.5, 3), (1.5, 1), (1.0, 2)]:
        f.push_request(sample(queue=q, rounds=r))
    assert f.average_queue_seconds() == pytest.approx(1.0)
    assert f.average_rounds_since_ttl_pause() == pytest.approx(2.0)
    assert f.average_completion_tokens() == pytest.approx(100.0)


def test_continuity_window_bounds_and_mean_impact() -> None:
    f = RankFactors(2)
    f.push_continuity(ContinuitySample(1.0, 2.0))
    assert not f.continuity_window_complete()
    f.push_continuity(ContinuitySample(2.0, 4.0))
    assert f.continuity_window_complete()
    assert f.average_cache_miss_impact_seconds() == pytest.approx(3.0)
    f.push_continuity(ContinuitySample(8.0, 10.0))
    assert f.continuity_intervals() == [2.0, 8.0]
    assert f.average_cache_miss_impact_seconds() == pytest.approx(7.0)


def test_ttl_pause_window_is_independent_of_the_request_window() -> None:
    f = RankFactors(2)
    for rounds in (4, 6, 8):
        f.push_ttl_pause_rounds(rounds)
    assert f.ttl_pause_rounds() == [6, 8]
    assert f.ttl_pause_sample_count == 2
    assert f.average_ttl_pause_rounds() == pytest.approx(7.0)
    assert f.request_sample_count == 0
    assert not f.request_window_complete()


def test_incremental_fit_matches_two_pass_fit_and_ignores_unusable_intervals() -> None:
    rng = random.Random(7)
    f = RankFactors(50)
    pushed: list[float] = []
    for i in range(537):
        interval = rng.lognormvariate(0.3, 1.1)
        if i % 17 == 0:
            interval = 0.0  # a same-instant arrival: not usable for the fit
        if i % 23 == 0:
            interval = math.inf
        f.push_continuity(ContinuitySample(interval, 1.0))
        pushed.append(interval)
    fit = f.log_normal_fit()
    reference = fit_log_normal(pushed[-50:])
    assert fit is not None and reference is not None
    assert fit.samples == reference.samples < 50
    assert fit.mu == pytest.approx(reference.mu, abs=1e-12)
    assert fit.sigma == pytest.approx(reference.sigma, abs=1e-9)


def test_running_sums_do_not_drift_over_many_evictions() -> None:
    rng = random.Random(3)
    f = RankFactors(100)
    window: list[RequestSample] = []
    for i in range(20_000):
        s = sample(
            prompt=rng.randrange(1, 100_000),
            cached=0,
            e2e=rng.uniform(0.0, 1e4) if i % 2 else rng.uniform(0.0, 1e-4),
            queue=rng.uniform(0.0, 300.0),
            decode=rng.uniform(0.0, 50.0),
            finished_at=float(i),
        )
        f.push_request(s)
        window = [*window[-99:], s]
    assert f.average_e2e_seconds() == pytest.approx(math.fsum(s.e2e_seconds for s in window) / 100, rel=1e-12)
    assert f.average_queue_seconds() == pytest.approx(
        math.fsum(s.queue_seconds for s in window) / 100, rel=1e-12
    )
    assert f.average_prompt_tokens() == sum(s.prompt_tokens for s in window) / 100


def test_window_size_must_be_positive() -> None:
    with pytest.raises(ValueError):
        RankFactors(0)
