"""The acting TTL before a Rank's continuity window is complete (beyond the spec; ``ttl_warmup: "pool"``).

The spec fits the acting TTL to the tool-call intervals one Rank has seen and arms 0 — pause at once —
until that Rank holds ``stats_window_size`` (100) of them. Each Rank fills its own window at its own
request rate, so a larger fleet at the same load per Rank waits just as long: about 6–8 modelled minutes on
``h200-llama-8b`` at 32 agents per GPU, 25–30 on ``h200-qwen-32b`` at 8. Until then every Program gives its
KV up the moment its request ends, and returns after a 5–15 s tool call to recompute a 100k-token context
(bench/miss_causes.py: about 6 % of all prompt tokens on the 8B collapse point, most of the misses the
mature TTL avoids).

A tool-call interval is the agent's, not the Rank's: the same agents return at the same rate whichever Rank
served them. With ``"pool"`` a Rank whose own window is still incomplete uses the fit of every Rank's
continuity samples together, once they number ``stats_window_size``; a Rank with a complete window uses its
own, as in the spec. The fit is the log-normal the spec fits (μ, σ of ln interval), pooled exactly from the
Ranks' fits (their sample counts, means and second moments), so it costs one pass over the Ranks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from progrouter.config import TTLWarmup
from progrouter.program.factors import MIN_LOG_SIGMA, LogNormalFit
from progrouter.program.policy import fitted_acting_ttl_from_fit

if TYPE_CHECKING:
    from progrouter.program.factors import RankFactors
    from progrouter.program.views import Pausing


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


def continuity_fit(core: Pausing, target_id: str) -> LogNormalFit | None:
    """The interval fit the acting TTL of ``target_id`` may use now, None while it must be 0: the Rank's own
    once its window is complete; before that, under ``"pool"``, every Rank's samples together once they
    number ``stats_window_size``."""
    factors: RankFactors | None = core.factors.get(target_id)
    if factors is not None and factors.continuity_window_complete():
        return factors.log_normal_fit()
    if core.config.ttl_warmup is not TTLWarmup.POOL:
        return None
    every = core.factors.values()
    if sum(f.continuity_sample_count for f in every) < core.config.stats_window_size:
        return None
    return pooled_fit(f.log_normal_fit() for f in every)


def fitted_ttl(core: Pausing, target_id: str, impact_seconds: float) -> float:
    """The spec's fitted acting TTL for a request that completed on ``target_id``, from ``continuity_fit``
    (the spec's value exactly under ``ttl_warmup: "spec"``)."""
    fit = continuity_fit(core, target_id)
    return fitted_acting_ttl_from_fit(
        fit, impact_seconds, core.config.max_acting_ttl_seconds, window_complete=fit is not None
    )
