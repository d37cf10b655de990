"""Pure mathematics of Program scheduling (upstream ``policy.rs`` plus the formulas scattered through the
scheduler files), spec upstream-behavior §3.5–§3.7, §3.10, §3.12, §3.15 and §4.3.

Every function here takes numbers or config pieces and returns numbers or small frozen dataclasses: no
clock, no I/O, no scheduler state. The scheduler core gathers the inputs (counts, sums, windows) and calls
these; keeping them apart makes each formula testable against hand-computed values. ``docs/formulas.md``
lists each formula with its upstream section.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from progrouter.config import DecodeThroughputModel, PrefillCostModel, ProgramSchedulingConfig
from progrouter.program.factors import MIN_LOG_SIGMA, LogNormalFit, RankFactors

__all__ = [
    "ACTING_TTL_GRID_POINTS",
    "CACHE_CONTINUITY_RATIO",
    "FORCE_RESUME_MIN_SECONDS",
    "FORCE_RESUME_WORK_FACTOR",
    "MIN_ACTING_TTL_SECONDS",
    "OBSERVATION_FRESHNESS_INTERVALS",
    "BatchGainEstimate",
    "BatchGainRank",
    "CapacityAccountingSource",
    "ForceResumeEstimate",
    "PoolThroughput",
    "RepairVictim",
    "acting_ttl_candidates",
    "active_remaining_rounds",
    "batch_gain_rank",
    "cache_continuous",
    "capacity_accounting_source",
    "completion_cache_miss_impact",
    "context_growth",
    "effective_force_resume_timeout",
    "estimate_active_program_tokens",
    "estimate_batch_gain",
    "fit_log_normal",
    "fitted_acting_ttl",
    "fitted_acting_ttl_for_rank",
    "fitted_acting_ttl_from_fit",
    "force_resume_timeout",
    "global_force_resume_estimate",
    "growth_reserve",
    "local_force_resume_estimate",
    "normal_cdf",
    "observation_fresh",
    "plan_capacity_repair",
    "private_tokens",
    "projected_usage",
    "protected_remaining_rounds",
    "rank_batch_gain",
    "repair_average_completion",
    "repair_relief",
    "repair_score",
    "shared_prefix_freshness_seconds",
    "target_rounds",
    "target_usage",
    "total_active_remaining_rounds",
]

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


# ---------------------------------------------------------------------------------------------------------
# Completion bookkeeping (§3.5, §3.10 step 7).

CACHE_CONTINUITY_RATIO = 0.9


def context_growth(prompt_tokens: int, previous_context_tokens: int | None) -> int | None:
    """prompt − previous, recorded only if previous > 0 and 0 < growth < previous."""
    if previous_context_tokens is None or previous_context_tokens <= 0:
        return None
    growth = prompt_tokens - previous_context_tokens
    return growth if 0 < growth < previous_context_tokens else None


def cache_continuous(previous_context_tokens: int | None, cached_prompt_tokens: int) -> bool:
    """No previous context, or the cached prefix covers ≥ 90 % of it (the KV survived)."""
    if previous_context_tokens is None or previous_context_tokens <= 0:
        return True
    return cached_prompt_tokens >= CACHE_CONTINUITY_RATIO * previous_context_tokens


def private_tokens(
    estimated_context_tokens: int,
    shared_prefix_tokens: int,
    *,
    expected_output_tokens: int | None,
    output_token_reservation: int | None,
    decode_buffer_tokens: int,
) -> int:
    """§2.4: max(0, context − shared prefix) + (expected output or reservation or decode buffer)."""
    output = (
        expected_output_tokens
        if expected_output_tokens is not None
        else output_token_reservation
        if output_token_reservation is not None
        else decode_buffer_tokens
    )
    return max(0, estimated_context_tokens - shared_prefix_tokens) + output


# ---------------------------------------------------------------------------------------------------------
# Target rounds and growth reserve (§3.5).


def target_rounds(factors: RankFactors | None, max_segment_rounds: int) -> int:
    """0 until the request window is complete; else clamp(ceil(2 × mean rounds_since_ttl_pause), 1, max)."""
    if factors is None or not factors.request_window_complete():
        return 0
    rounds = math.ceil(2.0 * factors.average_rounds_since_ttl_pause())
    return max(1, min(max_segment_rounds, rounds))


def protected_remaining_rounds(target_rounds: int, rounds_since_activation: int) -> int:
    """A Program's remaining protected rounds: max(0, target_rounds − rounds_since_activation)."""
    return max(0, target_rounds - rounds_since_activation)


def growth_reserve(avg_growth: float, target_rounds: int, active_remaining_rounds: Iterable[int]) -> float:
    """avg_growth × (target_rounds + Σ remaining); 0 if target_rounds ≤ 0 or avg_growth ≤ 0.

    Tokens kept free so the candidate and every active Program can grow through their protected rounds.
    """
    if target_rounds <= 0 or avg_growth <= 0.0:
        return 0.0
    return avg_growth * (target_rounds + sum(max(0, r) for r in active_remaining_rounds))


# ---------------------------------------------------------------------------------------------------------
# Batch-gain admission (§3.6).


@dataclass(frozen=True, slots=True)
class BatchGainEstimate:
    """Why a reserve-failing candidate was (not) admitted; all seconds."""

    admits: bool
    batch_gain_seconds: float
    candidate_recovery_seconds: float
    continuity_loss_seconds: float
    rel_gain: float


@dataclass(frozen=True, slots=True)
class BatchGainRank:
    """The Rank's side of batch-gain admission (§3.6), computed once per Rank state: ``estimate`` adds one
    candidate, so a scheduling pass that weighs many candidates against one Rank does the Rank's part once.

    ``usable`` is False when the estimate is disabled whatever the candidate (no token capacity, switched
    off, immature window, empty batch, no decode throughput), ``decode_seconds`` None when the decode time
    is unusable (the estimate refuses, reporting the relative gain)."""

    decode_model: DecodeThroughputModel
    prefill_model: PrefillCostModel
    usable: bool
    batch_size: int = 0
    context_tokens: int = 0
    before: float = 0.0
    decode_seconds: float | None = None
    growth: float = 0.0
    total_rounds: float = 0.0
    remaining: float = 0.0
    rounds_before: float = 0.0
    candidate_growth: float = 0.0  # growth × target rounds: room for the candidate's own rounds
    mean_impact: float | None = None  # None when no protected Program has rounds left

    def estimate(
        self, candidate_context_tokens: int, candidate_shared_prefix_tokens: int, required_tokens: float
    ) -> BatchGainEstimate:
        """Admit past the growth reserve iff the modelled decode gain ≥ recovery + continuity loss."""
        recovery = self.prefill_model.cache_miss_impact_seconds(
            max(0, candidate_context_tokens - max(0, candidate_shared_prefix_tokens))
        )
        if not self.usable:
            return BatchGainEstimate(False, 0.0, recovery, 0.0, 0.0)
        after = self.decode_model.throughput(
            self.batch_size + 1, self.context_tokens + candidate_context_tokens
        )
        rel_gain = max(0.0, after / self.before - 1.0)
        decode_s = self.decode_seconds
        if decode_s is None:
            return BatchGainEstimate(False, 0.0, recovery, 0.0, rel_gain)
        gain = decode_s * rel_gain
        g = self.growth
        loss = 0.0
        if g > 0.0:
            total_rounds, rounds_before = self.total_rounds, self.rounds_before
            rounds_after = min(
                total_rounds, max(0.0, self.remaining - required_tokens - self.candidate_growth) / g
            )
            eps = 2.220446049250313e-16
            if rounds_before > 0.0 and rounds_after <= eps:
                loss = math.inf
            elif self.mean_impact is None or rounds_after <= eps:
                loss = 0.0
            else:
                loss = (max(0.0, rounds_before - rounds_after) / rounds_after) * self.mean_impact
        return BatchGainEstimate(gain >= recovery + loss, gain, recovery, loss, rel_gain)


def batch_gain_rank(
    *,
    decode_model: DecodeThroughputModel,
    prefill_model: PrefillCostModel,
    enabled: bool,
    low_watermark_tokens: float | None,
    request_window_complete: bool,
    batch_size_before: int,
    context_tokens_before: int,
    avg_decode_seconds: float | None,
    avg_completion_tokens: float,
    avg_context_growth_tokens: float,
    target_rounds: int,
    used_tokens: float,
    protected_remaining_rounds: Sequence[float],
    protected_cache_miss_impacts: Sequence[float],
) -> BatchGainRank:
    """The Rank's side of ``estimate_batch_gain`` (its parameters less the candidate's)."""
    if len(protected_remaining_rounds) != len(protected_cache_miss_impacts):
        raise ValueError("protected_remaining_rounds and protected_cache_miss_impacts must be parallel")
    if low_watermark_tokens is None or not enabled or not request_window_complete or batch_size_before <= 0:
        return BatchGainRank(decode_model, prefill_model, False)
    before = decode_model.throughput(batch_size_before, context_tokens_before)
    if not before > 0.0:
        return BatchGainRank(decode_model, prefill_model, False)
    decode_s: float | None = (
        avg_decode_seconds
        if avg_decode_seconds is not None
        else batch_size_before * avg_completion_tokens / before
    )
    if decode_s is not None and (not math.isfinite(decode_s) or decode_s <= 0.0):
        decode_s = None
    g = avg_context_growth_tokens
    total_rounds = remaining = rounds_before = 0.0
    mean_impact: float | None = None
    if g > 0.0:
        pairs = [
            (r, c)
            for r, c in zip(protected_remaining_rounds, protected_cache_miss_impacts, strict=True)
            if r > 0
        ]
        total_rounds = math.fsum(r for r, _ in pairs)
        remaining = max(0.0, low_watermark_tokens - used_tokens)
        rounds_before = min(total_rounds, remaining / g)
        if pairs:
            mean_impact = math.fsum(c for _, c in pairs) / len(pairs)
    return BatchGainRank(
        decode_model,
        prefill_model,
        True,
        batch_size_before,
        context_tokens_before,
        before,
        decode_s,
        g,
        total_rounds,
        remaining,
        rounds_before,
        g * target_rounds,
        mean_impact,
    )


def estimate_batch_gain(
    *,
    decode_model: DecodeThroughputModel,
    prefill_model: PrefillCostModel,
    enabled: bool,
    low_watermark_tokens: float | None,
    request_window_complete: bool,
    batch_size_before: int,
    context_tokens_before: int,
    candidate_context_tokens: int,
    candidate_shared_prefix_tokens: int,
    avg_decode_seconds: float | None,
    avg_completion_tokens: float,
    avg_context_growth_tokens: float,
    target_rounds: int,
    used_tokens: float,
    required_tokens: float,
    protected_remaining_rounds: Sequence[float],
    protected_cache_miss_impacts: Sequence[float],
) -> BatchGainEstimate:
    """Admit past the growth reserve iff the modelled decode gain ≥ candidate recovery + continuity loss.

    ``low_watermark_tokens`` is C × low_watermark_ratio (None without token capacity). ``batch_size_before``
    and ``context_tokens_before`` are the active *reasoning* Programs on the Rank and the sum of their full
    contexts. ``protected_*`` are parallel: one entry per active Program other than the candidate; entries
    with remaining ≤ 0 are ignored (they have nothing left to protect).
    """
    rank = batch_gain_rank(
        decode_model=decode_model,
        prefill_model=prefill_model,
        enabled=enabled,
        low_watermark_tokens=low_watermark_tokens,
        request_window_complete=request_window_complete,
        batch_size_before=batch_size_before,
        context_tokens_before=context_tokens_before,
        avg_decode_seconds=avg_decode_seconds,
        avg_completion_tokens=avg_completion_tokens,
        avg_context_growth_tokens=avg_context_growth_tokens,
        target_rounds=target_rounds,
        used_tokens=used_tokens,
        protected_remaining_rounds=protected_remaining_rounds,
        protected_cache_miss_impacts=protected_cache_miss_impacts,
    )
    return rank.estimate(candidate_context_tokens, candidate_shared_prefix_tokens, required_tokens)


def rank_batch_gain(
    config: ProgramSchedulingConfig,
    factors: RankFactors | None,
    *,
    low_watermark_tokens: float | None,
    batch_size_before: int,
    context_tokens_before: int,
    used_tokens: float,
    protected_remaining_rounds: Sequence[float],
    protected_cache_miss_impacts: Sequence[float],
) -> BatchGainRank:
    """``batch_gain_rank`` with the config and the Rank's rolling statistics filled in
    (``low_watermark_tokens``: the Rank's C × low watermark, None without token capacity)."""
    return batch_gain_rank(
        decode_model=config.decode_throughput_model,
        prefill_model=config.prefill_cost_model,
        enabled=config.enable_batch_gain_admission,
        low_watermark_tokens=low_watermark_tokens,
        request_window_complete=factors is not None and factors.request_window_complete(),
        batch_size_before=batch_size_before,
        context_tokens_before=context_tokens_before,
        avg_decode_seconds=None if factors is None else factors.average_decode_seconds(),
        avg_completion_tokens=0.0 if factors is None else factors.average_completion_tokens(),
        avg_context_growth_tokens=0.0 if factors is None else factors.average_context_growth_tokens(),
        target_rounds=target_rounds(factors, config.max_segment_rounds),
        used_tokens=used_tokens,
        protected_remaining_rounds=protected_remaining_rounds,
        protected_cache_miss_impacts=protected_cache_miss_impacts,
    )


# ---------------------------------------------------------------------------------------------------------
# Force-resume deadline (§3.7).

FORCE_RESUME_MIN_SECONDS = 30.0
FORCE_RESUME_WORK_FACTOR = 3.0


class ForceResumeEstimate(NamedTuple):
    """The frozen timeout and its components (diagnostics show them; the fallback has zeros). A tuple:
    one is made per queued Program."""

    timeout_seconds: float
    active_remaining_rounds: float
    pool_remaining_rounds: float
    request_throughput_per_second: float
    fallback: bool

    @classmethod
    def static(cls, max_timeout_seconds: float) -> ForceResumeEstimate:
        return cls(max_timeout_seconds, 0.0, 0.0, 0.0, True)


def active_remaining_rounds(target_rounds: float, rounds_since_activation: int, *, reasoning: bool) -> float:
    """One Active Program's work ahead: max(target − rounds_since_activation, 1 if Reasoning else 0)."""
    floor = 1.0 if reasoning else 0.0
    return max(target_rounds - rounds_since_activation, floor)


def force_resume_timeout(
    active_remaining_rounds: float,
    pool_remaining_rounds: float,
    throughput: float,
    max_timeout: float,
    *,
    target_rounds: float | None = None,
) -> float:
    """clamp(3 × (active + pool) / throughput, min(30, max), max); ``max`` when throughput ≤ 0 or
    ``target_rounds`` (if given) ≤ 0 — the static fallback of an immature window."""
    if not throughput > 0.0 or (target_rounds is not None and target_rounds <= 0):
        return max_timeout
    minimum = min(FORCE_RESUME_MIN_SECONDS, max_timeout)
    estimate = FORCE_RESUME_WORK_FACTOR * (active_remaining_rounds + pool_remaining_rounds) / throughput
    if math.isnan(estimate):
        return max_timeout
    return min(max_timeout, max(minimum, estimate))


def total_active_remaining_rounds(
    target_rounds: int, reasoning: Iterable[int], acting: Iterable[int]
) -> float:
    """Σ ``active_remaining_rounds`` over a Rank's Active Programs, given the rounds_since_activation of
    its Reasoning and of its Acting ones. Programs with the same rounds are weighed once, by their count:
    every term is a whole number, so the exact sum is the same (and a Rank's Programs share a few values)."""
    return math.fsum(
        n * active_remaining_rounds(target_rounds, r, reasoning=True) for r, n in Counter(reasoning).items()
    ) + math.fsum(
        n * active_remaining_rounds(target_rounds, r, reasoning=False) for r, n in Counter(acting).items()
    )


def local_force_resume_estimate(
    *,
    target_rounds: int,
    throughput: float,
    active_remaining_rounds: float,
    waiters_ahead: int,
    max_timeout: float,
) -> ForceResumeEstimate:
    """Local mode: 3 × (the Rank's ``total_active_remaining_rounds`` + waiters ahead in its queue × target
    rounds) / throughput; the static fallback until the Rank's window is mature."""
    if target_rounds <= 0 or not throughput > 0.0:
        return ForceResumeEstimate.static(max_timeout)
    pool = float(waiters_ahead * max(target_rounds, 1))
    timeout = force_resume_timeout(
        active_remaining_rounds, pool, throughput, max_timeout, target_rounds=target_rounds
    )
    return ForceResumeEstimate(timeout, active_remaining_rounds, pool, throughput, False)


@dataclass(frozen=True, slots=True)
class PoolThroughput:
    """A model pool's Ranks summed for global force-resume estimates; ``mature`` only if every Rank is."""

    mature: bool
    request_throughput_per_second: float
    mean_target_rounds: float  # mean over the Ranks of max(target rounds, 1)

    @classmethod
    def of(cls, rank_rounds_and_throughput: Iterable[tuple[int, float]]) -> PoolThroughput:
        """From (target rounds, throughput) of every Rank of the pool (a Rank without factors: (0, 0.0))."""
        ranks = list(rank_rounds_and_throughput)
        if not ranks:
            return cls(False, 0.0, 1.0)
        mature = all(rounds > 0 and throughput > 0.0 for rounds, throughput in ranks)
        throughput = math.fsum(t for _, t in ranks)
        return cls(mature, throughput, math.fsum(max(r, 1) for r, _ in ranks) / len(ranks))


def global_force_resume_estimate(
    *, pool: PoolThroughput, active_remaining_rounds: float, waiters_ahead: int, max_timeout: float
) -> ForceResumeEstimate:
    """Global mode over a model pool: 3 × (the pool's remaining rounds + waiters ahead in the pool's resume
    order × mean target rounds) / summed throughput; the static fallback while any Rank is immature.
    (Upstream weights each waiter by its own Rank's rounds; the mean keeps the count a bisection.)"""
    if not pool.mature:
        return ForceResumeEstimate.static(max_timeout)
    throughput = pool.request_throughput_per_second
    waiting = waiters_ahead * pool.mean_target_rounds
    timeout = force_resume_timeout(active_remaining_rounds, waiting, throughput, max_timeout)
    return ForceResumeEstimate(timeout, active_remaining_rounds, waiting, throughput, False)


def effective_force_resume_timeout(
    estimate_seconds: float, hint_deadline_seconds: float | None, queue_timeout_seconds: float
) -> float:
    """min(hint deadline if given else the estimate, queue_timeout): a hint replaces the estimate."""
    chosen = hint_deadline_seconds if hint_deadline_seconds is not None else estimate_seconds
    return min(chosen, queue_timeout_seconds)


# ---------------------------------------------------------------------------------------------------------
# Capacity repair (§3.12).


def repair_score(elapsed_segment_seconds: float, input_tokens: float, avg_prompt_tokens: float) -> float:
    """elapsed × max(0.5, 1/√(input / avg_prompt)), avg_prompt ≥ 1, input ratio ≥ 1e-6.

    Long-running segments go first; small contexts are favoured as victims (cheap to recompute), large
    ones are discounted down to half.
    """
    avg = max(1.0, avg_prompt_tokens)
    ratio = max(1e-6, input_tokens / avg)
    return elapsed_segment_seconds * max(0.5, 1.0 / math.sqrt(ratio))


def repair_average_completion(factors: RankFactors | None) -> float:
    """ceil(mean completion tokens) of the Rank (0 without factors)."""
    return 0.0 if factors is None else float(math.ceil(factors.average_completion_tokens()))


def projected_usage(
    usage_tokens: float,
    avg_completion_tokens: float,
    active_reasoning_programs: int,
    marked_reasoning_private_tokens: float,
    marked_reasoning_programs: int,
) -> float:
    """max(0, usage + avg_completion × #reasoning − Σprivate(marked) − avg_completion × #marked).

    Relief already committed by earlier marks is subtracted so repair does not mark extra victims for it.
    """
    return max(
        0.0,
        usage_tokens
        + avg_completion_tokens * active_reasoning_programs
        - marked_reasoning_private_tokens
        - avg_completion_tokens * marked_reasoning_programs,
    )


def repair_relief(private_tokens: float, *, reasoning: bool, avg_completion_tokens: float) -> float:
    """What pausing (Acting) or marking (Reasoning) one victim takes off the projection."""
    return private_tokens + (avg_completion_tokens if reasoning else 0.0)


@dataclass(frozen=True, slots=True)
class RepairVictim:
    """A repair candidate: an idle Acting Program, or a Reasoning one with requests in flight, unmarked."""

    program_id: str
    reasoning: bool
    score: float
    private_tokens: float


def plan_capacity_repair(
    projected: float,
    high_tokens: float,
    low_tokens: float,
    victims: Iterable[RepairVictim],
    avg_completion_tokens: float,
) -> list[RepairVictim]:
    """Victims to pause (Acting) or mark (Reasoning), in order; empty unless projected > high.

    Sorted by score descending, then larger private tokens, then program_id; walk until projected ≤ low.
    Assumes every pause/mark succeeds (the scheduler applies them in this order).
    """
    if projected <= high_tokens:
        return []
    ordered = sorted(victims, key=lambda v: (-v.score, -v.private_tokens, v.program_id))
    chosen: list[RepairVictim] = []
    for victim in ordered:
        if projected <= low_tokens:
            break
        chosen.append(victim)
        relief = repair_relief(
            victim.private_tokens, reasoning=victim.reasoning, avg_completion_tokens=avg_completion_tokens
        )
        projected = max(0.0, projected - relief)
    return chosen


# ---------------------------------------------------------------------------------------------------------
# Shared-prefix freshness (§3.15).


def shared_prefix_freshness_seconds(
    warmup_seconds: float,
    kv_turnovers: float,
    capacity_tokens: int | None,
    avg_e2e_seconds: float,
    active_reasoning_programs: int,
    avg_uncached_prompt_tokens: float,
    window_complete: bool,
) -> float:
    """kv_turnovers × C × avg_e2e / active_reasoning / avg_uncached_prompt; warm-up otherwise.

    How long it takes the Rank's uncached prefill traffic to turn the KV over ``kv_turnovers`` times: after
    that a shared prefix observed earlier has probably been evicted.
    """
    if (
        not window_complete
        or capacity_tokens is None
        or active_reasoning_programs <= 0
        or not avg_uncached_prompt_tokens > 0.0
        or not avg_e2e_seconds > 0.0
    ):
        return warmup_seconds
    seconds = (
        kv_turnovers
        * capacity_tokens
        * avg_e2e_seconds
        / active_reasoning_programs
        / avg_uncached_prompt_tokens
    )
    if math.isfinite(seconds) and seconds >= 0.0:
        return seconds
    return warmup_seconds


# ---------------------------------------------------------------------------------------------------------
# Backend observation → managed usage (§4.3).

OBSERVATION_FRESHNESS_INTERVALS = 3.0


class CapacityAccountingSource(StrEnum):
    BACKEND_OBSERVATION = "backend_observation"
    ROUTER_LEDGER_MISSING_OBSERVATION = "router_ledger_missing_observation"
    ROUTER_LEDGER_STALE_OBSERVATION = "router_ledger_stale_observation"
    ROUTER_LEDGER_MISSING_TOKEN_ESTIMATE = "router_ledger_missing_token_estimate"


def estimate_active_program_tokens(
    kv_usage: float,
    capacity_tokens: int | None,
    running: int,
    router_active_reasoning_programs: int,
    router_reasoning_private_tokens: float,
    acting_private_tokens: float,
) -> float | None:
    """Managed tokens of the Rank's Active Programs from one scrape (None without token capacity).

    vLLM's KV usage covers the running requests; scaled up to the Router's reasoning count when the Router
    knows of more Programs than vLLM runs. Acting KV is invisible to ``running``, so the ledger adds it.
    """
    if capacity_tokens is None:
        return None
    native_used = kv_usage * capacity_tokens
    if running > 0:
        reasoning = native_used * max(router_active_reasoning_programs, running) / running
    elif router_active_reasoning_programs > 0:
        reasoning = router_reasoning_private_tokens
    else:
        reasoning = native_used
    return reasoning + acting_private_tokens


def observation_fresh(age_seconds: float, metrics_interval_seconds: float) -> bool:
    """Fresh while age ≤ 3 × metrics_interval."""
    return age_seconds <= OBSERVATION_FRESHNESS_INTERVALS * metrics_interval_seconds


def capacity_accounting_source(
    *, has_observation: bool, fresh: bool, has_token_estimate: bool
) -> CapacityAccountingSource:
    if not has_observation:
        return CapacityAccountingSource.ROUTER_LEDGER_MISSING_OBSERVATION
    if not fresh:
        return CapacityAccountingSource.ROUTER_LEDGER_STALE_OBSERVATION
    if not has_token_estimate:
        return CapacityAccountingSource.ROUTER_LEDGER_MISSING_TOKEN_ESTIMATE
    return CapacityAccountingSource.BACKEND_OBSERVATION


def target_usage(
    *,
    fresh: bool,
    est_active_program_tokens: float | None,
    delta_since_checkpoint: float,
    ledger_tokens: float,
) -> float:
    """Fresh observation with an estimate: max(0, estimate + delta since the checkpoint); else the ledger.

    The delta is the Router's own admissions/pauses committed after the scrape's checkpoint, so decisions
    made while a scrape was in flight are not forgotten.
    """
    if fresh and est_active_program_tokens is not None:
        return max(0.0, est_active_program_tokens + delta_since_checkpoint)
    return ledger_tokens
