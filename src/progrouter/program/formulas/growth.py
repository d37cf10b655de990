"""A Program's tokens as it runs (§2.4, §3.5, §3.10 step 7): context growth, cache continuity, private
tokens, target rounds and the growth reserve admission keeps free for them.

Pure: numbers and config pieces in, numbers or small frozen values out (docs/formulas.md lists each
formula with its upstream section)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from progrouter.program.core.factors import RankFactors

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
