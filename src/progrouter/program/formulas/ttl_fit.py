"""The fitted acting TTL (§3.10 step 4): the log-normal fit of a Rank's tool-call intervals and the TTL that
balances holding capacity against a cache miss; the exact normal CDF it integrates.

Pure: numbers and config pieces in, numbers or small frozen values out (docs/formulas.md lists each
formula with its upstream section)."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import NamedTuple

from progrouter.config import PrefillCostModel
from progrouter.program.core.factors import MIN_LOG_SIGMA, LogNormalFit, RankFactors

# ---------------------------------------------------------------------------------------------------------
# Normal CDF (exact; upstream approximates erf by Abramowitz–Stegun 7.1.26, |error| ≤ 1.5e-7).

_SQRT1_2 = 1.0 / math.sqrt(2.0)


def normal_cdf(x: float) -> float:
    """Φ(x), exact to double precision through ``math.erfc``.

    Upstream uses the Abramowitz–Stegun erf approximation (|error| < 1.5e-7); the exact function is both more
    accurate and about three times faster here, and the acting-TTL fit evaluates it 70 times per completion.
    """
    return 0.5 * math.erfc(-x * _SQRT1_2)


# ---------------------------------------------------------------------------------------------------------
# Progress-TTL: the acting TTL fitted to the Rank's continuity intervals (§3.10 step 4).

MIN_ACTING_TTL_SECONDS = 0.05
ACTING_TTL_GRID_POINTS = 32


def fit_log_normal(intervals: Iterable[float]) -> LogNormalFit | None:
    """Two-pass μ, σ of ln(interval) over the positive finite intervals (None if there are none)."""
    logs = [math.log(i) for i in intervals if math.isfinite(i) and i > 0.0]
    if not logs:
        return None
    mu = math.fsum(logs) / len(logs)
    variance = math.fsum((x - mu) ** 2 for x in logs) / len(logs)
    return LogNormalFit(mu=mu, sigma=max(math.sqrt(variance), MIN_LOG_SIGMA), samples=len(logs))


@functools.lru_cache(maxsize=4096)
def acting_ttl_candidates(max_ttl: float) -> tuple[float, ...]:
    """{0, min_ttl, max_ttl} then 32 log-spaced points min_ttl..max_ttl (upstream order; ties → later).

    Cached: with the common cap (``max_acting_ttl_seconds``) every completion asks for the same grid.
    """
    min_ttl = min(MIN_ACTING_TTL_SECONDS, max_ttl)
    candidates = [0.0, min_ttl, max_ttl]
    if max_ttl > min_ttl:
        log_min, log_max = math.log(min_ttl), math.log(max_ttl)
        last = ACTING_TTL_GRID_POINTS - 1
        candidates.extend(math.exp(log_min + (log_max - log_min) * i / last) for i in range(last + 1))
    return tuple(candidates)


def pooled_fit(fits: Iterable[LogNormalFit | None]) -> LogNormalFit | None:
    """One log-normal fit of the samples behind ``fits``: the samples' mean and population variance of
    ln(interval) recovered from each fit's (μ, σ, n). None when no fit has samples."""
    n = 0
    log_sum = log_sq_sum = 0.0
    for fit in fits:
        if fit is None or fit.samples <= 0:
            continue
        n += fit.samples
        log_sum += fit.mu * fit.samples
        log_sq_sum += (fit.sigma * fit.sigma + fit.mu * fit.mu) * fit.samples
    if n == 0:
        return None
    mu = log_sum / n
    variance = max(0.0, log_sq_sum / n - mu * mu)
    return LogNormalFit(mu=mu, sigma=max(math.sqrt(variance), MIN_LOG_SIGMA), samples=n)


@functools.lru_cache(maxsize=1024)
def fitted_acting_ttl_from_fit(
    fit: LogNormalFit | None,
    impact_seconds: float,
    max_acting_ttl_seconds: float,
    *,
    window_complete: bool,
) -> float:
    """The utility-maximising acting TTL given a precomputed fit; 0 before the window is complete.

    Cached (a pure function of values): the per-tick gauge asks again for every Rank whose window did not
    move, and 35 grid points are not cheap."""
    if not window_complete or fit is None:
        return 0.0
    max_ttl = min(max_acting_ttl_seconds, impact_seconds)
    if not max_ttl > 0.0 or not impact_seconds > 0.0:
        return 0.0
    if _no_candidate_gains(fit, impact_seconds, max_ttl):
        return 0.0
    return _grid_argmax(fit, impact_seconds, max_ttl)


#: ln-slack above the cap for the no-gain bound: the grid's last point, exp(ln cap), may round above the cap
_CAP_LOG_SLACK = 1e-9


def _no_candidate_gains(fit: LogNormalFit, impact_seconds: float, max_ttl: float) -> bool:
    """True when no grid candidate d > 0 can have U(d) ≥ 0, so the grid's answer is 0 (the common case:
    tool calls far longer than a cold start costs). For d in [min TTL, cap], Φ(z) ≤ Φ(z at the cap) = h
    and d ≥ min TTL, so U(d) ≤ C·h − min TTL·(1 − h); requiring C·h below half of that cost leaves a
    margin no float rounding of the grid's terms can cross (any NaN fails the test: the grid decides)."""
    min_ttl = min(MIN_ACTING_TTL_SECONDS, max_ttl)
    z = (math.log(max_ttl) + _CAP_LOG_SLACK - fit.mu) / fit.sigma
    hit = 0.5 * math.erfc(-z * _SQRT1_2)
    return impact_seconds * hit < 0.5 * min_ttl * (1.0 - hit)


class _Grid(NamedTuple):
    """``acting_ttl_candidates(max_ttl)``'s positive points in order, each with its logarithm, and the least
    logarithm among them."""

    points: tuple[tuple[float, float], ...]
    least_log: float


@functools.lru_cache(maxsize=4096)
def _grid(max_ttl: float) -> _Grid:
    """Cached beside the candidates: a fit that moved scores the same points again."""
    points = tuple((ttl, math.log(ttl)) for ttl in acting_ttl_candidates(max_ttl) if ttl > 0.0)
    return _Grid(points, min(log_ttl for _, log_ttl in points))


#: ``math.erfc(x)`` is exactly 2.0 for every x at or below this (fdlibm's erfc, glibc's and musl's too:
#: "x <= -6: return two - tiny"); tests/program/test_policy.py checks the grid against it.
_ERFC_IS_TWO = -6.0


def _grid_argmax(fit: LogNormalFit, impact_seconds: float, max_ttl: float) -> float:
    """The candidate of ``acting_ttl_candidates(max_ttl)`` with the largest utility (ties: the later)."""
    # U(d) = C·Φ(z) − m·Φ(z − σ) − d·(1 − Φ(z)), z = (ln d − μ)/σ, m = E[T]; U(0) = 0: the expected
    # seconds saved by holding the KV for d (the recompute C avoided when the next request comes back within
    # d, minus the time the KV sits idle: the gap itself when it returns in time, d when it does not).
    mu, sigma, half_mean = fit.mu, fit.sigma, fit.mean * 0.5
    erfc, k = math.erfc, _SQRT1_2
    grid = _grid(max_ttl)
    if max_ttl < math.inf and -((grid.least_log - mu) / sigma - sigma) * k <= _ERFC_IS_TWO:
        # Every interval returns well within the shortest candidate (tool calls far shorter than the least
        # TTL): both erfc terms are exactly 2.0 at every point (their arguments only fall as d grows, and
        # σ > 0), so every U(d) is the same float, and the grid's answer is its last point if that is ≥ 0.
        utility = impact_seconds * 1.0 - half_mean * 2.0 - 0.0
        return grid.points[-1][0] if utility >= 0.0 else 0.0
    best_ttl, best_utility = 0.0, 0.0  # U(0) = 0: the candidate 0 comes first
    for ttl, log_ttl in grid.points:
        z = (log_ttl - mu) / sigma
        hit = 0.5 * erfc(-z * k)
        utility = impact_seconds * hit - half_mean * erfc(-(z - sigma) * k) - ttl * (1.0 - hit)
        if utility >= best_utility:
            best_ttl, best_utility = ttl, utility
    return best_ttl


def fitted_acting_ttl(
    intervals: Iterable[float],
    impact_seconds: float,
    max_acting_ttl_seconds: float,
    *,
    window_complete: bool,
) -> float:
    """Upstream ``fitted_acting_ttl``: log-normal fit of ``intervals``, capped at min(max, impact)."""
    if not window_complete:
        return 0.0
    return fitted_acting_ttl_from_fit(
        fit_log_normal(intervals), impact_seconds, max_acting_ttl_seconds, window_complete=True
    )


def fitted_acting_ttl_for_rank(
    factors: RankFactors | None, impact_seconds: float, max_acting_ttl_seconds: float
) -> float:
    """Convenience for the scheduler: the fitted TTL of a Rank (0 without factors), O(1) fit."""
    if factors is None:
        return 0.0
    return fitted_acting_ttl_from_fit(
        factors.log_normal_fit(),
        impact_seconds,
        max_acting_ttl_seconds,
        window_complete=factors.continuity_window_complete(),
    )


def completion_cache_miss_impact(
    prefill_model: PrefillCostModel, prompt_tokens: int, shared_prefix_tokens: int
) -> float:
    """§3.10 step 2: impact(prompt − min(shared_prefix, prompt)); the shared prefix is assumed to survive."""
    shared = min(max(0, shared_prefix_tokens), prompt_tokens)
    return prefill_model.cache_miss_impact_seconds(max(0, prompt_tokens - shared))
