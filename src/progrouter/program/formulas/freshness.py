"""Shared-prefix freshness (§3.15): how long a shared prefix observed on a Rank probably stays resident.

Pure: numbers and config pieces in, numbers or small frozen values out (docs/formulas.md lists each
formula with its upstream section)."""

from __future__ import annotations

import math

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
