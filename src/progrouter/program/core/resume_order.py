"""Resume order (upstream §3.8): a waiting Program's place in its Rank queue and among cross-Rank candidates.

Within one Rank queue: the forced tier (its force-resume deadline has passed), larger front-request
``priority``, not paused by segment yield before yielded, then ``resume_order`` (``mru``: most recent last
finish first, never-finished last, then earlier queue time; ``fcfs``: earlier queue time), then program id.
Cross-Rank candidates use tiers 1–3, then always FCFS. Pure functions of a Program, its force-resume
record (``force_resume.ForceResumeKeeper``'s) and its front hints.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from progrouter.config import ResumeOrder
from progrouter.program.core.records import PauseReason

if TYPE_CHECKING:
    from progrouter.program.core.records import ForceResume, QueueKey
    from progrouter.program.core.state import Program
    from progrouter.program.types import RequestHints

#: enum members read for every queued Program, as plain globals (why: ``state.ACTIVE``)
_YIELD, _MRU = PauseReason.MAX_SEGMENT_YIELD, ResumeOrder.MRU


def forced(force: ForceResume | None, now: float) -> bool:
    """``force``: a Program's force-resume record (the keeper's)."""
    return force is not None and force.deadline <= now


def _tiers(
    program: Program, force: ForceResume | None, front: RequestHints | None, now: float
) -> tuple[int, int, int]:
    priority = front.priority if front is not None else 0
    pause = program.lifecycle.pause
    yielded = 1 if pause is not None and pause.reason is _YIELD else 0
    return (0 if forced(force, now) else 1, -priority, yielded)


def queued_at(force: ForceResume | None, now: float) -> float:
    return force.queued_at if force is not None else now


def local_key(
    program: Program, force: ForceResume | None, front: RequestHints | None, order: ResumeOrder, now: float
) -> QueueKey:
    """The Program's place in its Rank queue; ``force``: its force-resume record; ``front``: the hints of
    its front request."""
    forced, priority, yielded = _tiers(program, force, front, now)
    queued = queued_at(force, now)
    if order is _MRU:
        finished = program.lifecycle.completions.last_finished_at
        recency = -finished if finished is not None else math.inf
        return (forced, priority, yielded, recency, queued, program.ref.program_id, program.serial)
    return (forced, priority, yielded, queued, 0.0, program.ref.program_id, program.serial)


def cross_rank_key(
    program: Program, force: ForceResume | None, front: RequestHints | None, now: float
) -> QueueKey:
    forced, priority, yielded = _tiers(program, force, front, now)
    return (forced, priority, yielded, queued_at(force, now), 0.0, program.ref.program_id, program.serial)
