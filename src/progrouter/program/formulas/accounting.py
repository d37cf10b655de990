"""Capacity accounting (§4.3): a Rank's managed usage from a fresh backend observation, else the ledger.

Pure: numbers and config pieces in, numbers or small frozen values out (docs/formulas.md lists each
formula with its upstream section)."""

from __future__ import annotations

from enum import StrEnum

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


def rank_usage(
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
