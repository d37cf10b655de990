"""Capacity repair's victim order, idle-first (beyond the spec; ``repair_order: "idle_first"``).

The spec's ``repair_score`` ranks victims by how long their segment has run (large contexts discounted), so
an Acting Program that finished a request a second ago — and is about to come back with a 100k-token
context — may be paused before one that has been idle for minutes. Idle-first pauses idle Acting Programs
first, longest idle first (with tool calls' falling return rate, the least likely to be back soon), and
marks Reasoning ones only after them, in the spec's order.
"""

from __future__ import annotations

from progrouter.program.records import ActingTTL

#: Above any spec score (seconds of a segment, at most × 1): every idle Acting Program ranks before every
#: Reasoning one.
ACTING_FIRST = 1e12


def idle_first_score(*, reasoning: bool, acting_ttl: ActingTTL | None, now: float, spec: float) -> float:
    """The victim score (higher goes first): idle Acting Programs by how long they have been idle (since
    their acting TTL was armed), then the others by the spec's score."""
    if reasoning or acting_ttl is None:
        return spec
    return ACTING_FIRST + max(0.0, now - acting_ttl.since)
