"""The force-resume deadline (§3.7): when a waiting Program's queue wait turns into force.

Pure: numbers and config pieces in, numbers or small frozen values out (docs/formulas.md lists each
formula with its upstream section)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

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
