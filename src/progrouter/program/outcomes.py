"""The values that cross the scheduler API: a request arriving, and what became of it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from progrouter.program.core.request_pool import RequestHandle
from progrouter.program.core.state import ProgramRef
from progrouter.program.types import ProgramIdentity, RequestHints
from progrouter.routing.target import Target


class ProgramRequest(NamedTuple):
    """A request with Program identity. ``routing_text`` is only kept for ``cache_aware`` binding. (A
    tuple: one is made per request.)"""

    identity: ProgramIdentity
    hints: RequestHints
    model_pool: str
    estimated_context_tokens: int
    routing_text: str | None = None
    # residency_aware: the full-block tokens of this prompt, and the leading tokens of it each Rank with known
    # KV events holds (residency.py)
    residency: tuple[int, Mapping[str, int]] | None = None


class ProgramDispatch(NamedTuple):
    """A request sent to its Rank. Hand it back to ``complete`` exactly once, whatever happens to it. (A
    tuple: one is made per request.)"""

    handle: RequestHandle
    target: Target
    program: ProgramRef
    placement_epoch: int
    estimated_context_tokens: int
    arrived_at: float
    dispatched_at: float
    queued_seconds: float
    hints: RequestHints
    placement_start_request: bool  # the first request of this placement (a segment may start here)


class Dispatched(NamedTuple):
    """The request goes to its Rank now (a tuple: one is made per request)."""

    handle: RequestHandle
    dispatch: ProgramDispatch


class TimedOut(NamedTuple):
    """The request stayed in the RequestPool past its queue timeout: answer 429 (``QueueTimeout``)."""

    handle: RequestHandle


Outcome = Dispatched | TimedOut


class Outbox:
    """The decisions not yet taken by the shell, and every dispatch awaiting its completion."""

    __slots__ = ("outcomes", "outstanding")

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []
        self.outstanding: dict[int, ProgramDispatch] = {}  # handle id -> dispatch awaiting completion

    def dispatched(self, dispatch: ProgramDispatch) -> None:
        self.outstanding[dispatch.handle.id] = dispatch
        self.outcomes.append(Dispatched(dispatch.handle, dispatch))

    def timed_out(self, handle: RequestHandle) -> None:
        self.outcomes.append(TimedOut(handle))

    def settle(self, handle_id: int) -> ProgramDispatch | None:
        """The dispatch ``handle_id`` completed: forget it (None if it was not outstanding)."""
        return self.outstanding.pop(handle_id, None)

    def take(self) -> list[Outcome]:
        outcomes, self.outcomes = self.outcomes, []
        return outcomes
