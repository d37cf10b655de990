"""A weighed acting TTL (beyond the spec; ``acting_ttl_policy: "weighed"``).

The spec's fitted TTL maximises U(d) = C·P(T ≤ d) − E[idle seconds while holding] over d ≤ min(10 s, C):
holding the KV costs one second per idle second, whoever wants it. With real agents' tool calls (median
13 s, a heavy tail) that cap pauses most Programs just before they come back, and each return then
recomputes a 100k-token context. Here the idle seconds are weighed by the work waiting for the KV: ``weight``
waiting Programs (0 when nobody waits, so holding costs nothing) — and the decision is taken again while the
Program holds (given that it has not come back after ``elapsed`` seconds), so a waiter that arrives later
ends a long hold at the next check instead of its end.

For T log-normal (μ, σ, mean m) and a Program idle for ``t`` seconds, holding until ``d > t`` is worth

    U_t(d) = C·(F(d) − F(t)) − w·[E[T; t < T ≤ d] − t·(F(d) − F(t)) + (d − t)·(1 − F(d))]

(times 1 / (1 − F(t)), which does not move the maximum), with F(x) = Φ((ln x − μ)/σ) and
E[T; T ≤ x] = m·Φ((ln x − μ)/σ − σ). At t = 0 and w = 1 it is the spec's U(d).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from progrouter.program.core.factors import LogNormalFit
from progrouter.program.formulas.ttl_fit import acting_ttl_candidates

if TYPE_CHECKING:
    from progrouter.config import ProgramSchedulingConfig
    from progrouter.program.core.factors import RankStats
    from progrouter.program.core.queues import RankQueues
    from progrouter.program.core.state import Program
    from progrouter.program.variants.warmup import Warmup

_SQRT1_2 = 1.0 / math.sqrt(2.0)


def _cdf(z: float) -> float:
    return 0.5 * math.erfc(-z * _SQRT1_2)


def hold_utility(
    fit: LogNormalFit, impact_seconds: float, weight: float, elapsed: float, until: float
) -> float:
    """U_t(d) above (unnormalised): the expected seconds saved by holding from ``elapsed`` to ``until``."""
    if until <= elapsed:
        return 0.0
    mu, sigma, mean = fit.mu, fit.sigma, fit.mean
    z_d = (math.log(until) - mu) / sigma
    f_d = _cdf(z_d)
    if elapsed > 0.0:
        z_t = (math.log(elapsed) - mu) / sigma
        f_t, e_t = _cdf(z_t), mean * _cdf(z_t - sigma)
    else:
        f_t = e_t = 0.0
    returns = f_d - f_t
    idle = (mean * _cdf(z_d - sigma) - e_t) - elapsed * returns + (until - elapsed) * (1.0 - f_d)
    return impact_seconds * returns - weight * idle


def weighed_hold_seconds(
    fit: LogNormalFit | None,
    impact_seconds: float,
    weight: float,
    elapsed_seconds: float,
    max_hold_seconds: float,
    *,
    window_complete: bool,
) -> float:
    """How much longer an idle Program that has not come back for ``elapsed_seconds`` should keep its KV:
    the best of 0 and a log grid up to ``max_hold_seconds`` − elapsed; 0 releases it now (and always before
    the Rank's continuity window is complete, like the spec's TTL)."""
    if not window_complete or fit is None or not impact_seconds > 0.0:
        return 0.0
    left = max_hold_seconds - elapsed_seconds
    if not left > 0.0:
        return 0.0
    if weight <= 0.0:
        return left  # nobody waits: holding costs nothing
    best, best_utility = 0.0, 0.0
    for extra in acting_ttl_candidates(left):
        if extra <= 0.0:
            continue
        utility = hold_utility(fit, impact_seconds, weight, elapsed_seconds, elapsed_seconds + extra)
        if utility >= best_utility and utility > 0.0:  # (no gain, e.g. far in the tail: no hold)
            best, best_utility = extra, utility
    return best


def waiting_weight(local_waiters: int, pool_waiters: int, pool_ranks: int, *, global_queue: bool) -> float:
    """The waiting Programs one Rank's held KV keeps out: its own queue, plus in ``global_queue`` mode its
    share of the pool's (the cross-Rank pass moves those to Ranks with room)."""
    weight = float(local_waiters)
    if global_queue and pool_ranks > 0:
        weight += (pool_waiters - local_waiters) / pool_ranks
    return max(0.0, weight)


def hold_seconds(
    config: ProgramSchedulingConfig,
    stats: RankStats,
    queues: RankQueues,
    warmup: Warmup,
    program: Program,
    rank_id: str,
    elapsed_seconds: float,
) -> float:
    """The weighed TTL of an idle Active Program on ``rank_id`` idle for ``elapsed_seconds``, up to the
    next check (``weighed_ttl_check_seconds``); 0 when it should pause now. The pool's share is over the
    Ranks the scheduler keeps statistics for."""
    factors = stats.get(rank_id)
    if factors is None:
        return 0.0
    weight = waiting_weight(
        queues.size(rank_id),
        queues.pool_waiting(program.ref.model_pool),
        len(stats),
        global_queue=config.global_queue,
    )
    fit = warmup.continuity_fit(stats, rank_id)
    hold = weighed_hold_seconds(
        fit,
        program.last_cache_miss_impact_seconds,
        weight,
        elapsed_seconds,
        config.weighed_ttl_max_seconds,
        window_complete=fit is not None,
    )
    return min(hold, config.weighed_ttl_check_seconds)
