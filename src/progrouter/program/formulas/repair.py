"""Capacity repair (§3.12): which Active Programs pause when a Rank's usage outgrows its capacity.

Pure: numbers and config pieces in, numbers or small frozen values out (docs/formulas.md lists each
formula with its upstream section)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from progrouter.program.core.factors import RankFactors

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
