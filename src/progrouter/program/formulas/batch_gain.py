"""Batch-gain admission (§3.6): whether admitting a reserve-failing candidate shortens the batch's work.

Pure: numbers and config pieces in, numbers or small frozen values out (docs/formulas.md lists each
formula with its upstream section)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from progrouter.config import DecodeThroughputModel, PrefillCostModel, ProgramSchedulingConfig
from progrouter.program.core.factors import RankFactors
from progrouter.program.formulas.growth import target_rounds

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
