"""RequestPool: the requests Program scheduling retains while their Program waits for capacity.

One FIFO per Program generation; only its front request can be dispatched, and the front request's hints
(priority, deadline) are what resume ordering sees. A request can leave from any position (its client went
away, or its queue timeout passed). The pool only keeps requests; it decides nothing.

It also keeps the queue deadlines of retained requests in arrival order, as long as that is deadline order
(every deadline is arrival + the queue timeout unless a shorter ``deadline_seconds`` hint makes it earlier:
such a request is left to the scheduler's timers). A request leaving takes its deadline with it, so the
queue timeouts of requests dispatched long before them never wait in the timer heap.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from progrouter.program.types import RequestHints

if TYPE_CHECKING:
    from progrouter.program.core.state import Program


class RequestHandle(NamedTuple):
    """The shell's token for one arrived request; valid until the request is dispatched or dropped. (A
    tuple: one is made per request.)"""

    id: int
    model_pool: str
    program_id: str
    generation: int


class PendingRequest(NamedTuple):
    """One retained request (upstream ``PendingProgramRequest``; a tuple: one is made per request)."""

    handle: RequestHandle
    arrived_at: float
    estimated_context_tokens: int
    routing_text: str | None
    hints: RequestHints
    queue_deadline: float  # arrival + min(queue_timeout, deadline_seconds)


class RequestPool:
    """Per-Program FIFOs plus a handle index, so cancellation finds a request in O(1)."""

    def __init__(self) -> None:
        self._fifos: dict[Program, dict[int, PendingRequest]] = {}  # handle id -> request, in arrival order
        self._owner: dict[int, Program] = {}
        self._deadlines: dict[int, float] = {}  # handle id -> queue deadline, non-decreasing (see ``push``)
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        """Retained requests across all Programs (diagnostics' ``retained_requests``)."""
        return len(self._owner)

    def programs(self) -> Iterable[Program]:
        """The Programs with requests waiting (for diagnostics only); at most ``max_pooled_requests``."""
        return self._fifos.keys()

    def new_handle(self, program: Program) -> RequestHandle:
        ref = program.ref
        return RequestHandle(next(self._ids), ref.model_pool, ref.program_id, ref.generation)

    def push(self, program: Program, request: PendingRequest) -> bool:
        """Retain ``request``; returns whether the pool keeps its queue deadline in order (``expired``), which
        it does unless the deadline is earlier than the last one kept."""
        handle_id = request.handle.id
        fifo = self._fifos.get(program)
        if fifo is None:
            fifo = self._fifos[program] = {}
        fifo[handle_id] = request
        self._owner[handle_id] = program
        deadlines, deadline = self._deadlines, request.queue_deadline
        if deadlines and deadline < next(reversed(deadlines.values())):
            return False
        deadlines[handle_id] = deadline
        return True

    def expired(self, now: float) -> list[tuple[float, int]]:
        """(deadline, handle id) of the requests whose deadline the pool keeps and which is at or before
        ``now``, earliest first."""
        out = []
        for handle_id, deadline in self._deadlines.items():
            if deadline > now:
                break
            out.append((deadline, handle_id))
        return out

    def next_deadline(self) -> float | None:
        """The earliest queue deadline the pool keeps."""
        return next(iter(self._deadlines.values()), None)

    def waiting(self, program: Program) -> int:
        fifo = self._fifos.get(program)
        return len(fifo) if fifo is not None else 0

    def front(self, program: Program) -> PendingRequest | None:
        fifo = self._fifos.get(program)
        if not fifo:
            return None
        return next(iter(fifo.values()))

    def front_hints(self, program: Program) -> RequestHints | None:
        front = self.front(program)
        return front.hints if front is not None else None

    def take_all(self, program: Program) -> list[PendingRequest]:
        """Take every retained request of ``program`` out for dispatch, front first (an Active Program
        dispatches them all at once)."""
        fifo = self._fifos.pop(program, None)
        if fifo is None:
            return []
        owner, deadlines = self._owner, self._deadlines
        for handle_id in fifo:
            del owner[handle_id]
            deadlines.pop(handle_id, None)
        return list(fifo.values())

    def owner(self, handle: RequestHandle) -> Program | None:
        """The Program a retained request belongs to, or None if it is no longer retained."""
        return self._owner.get(handle.id)

    def holds(self, handle_id: int) -> bool:
        """Whether the request with this handle id is still retained."""
        return handle_id in self._owner

    def retained(self, handle_id: int) -> PendingRequest | None:
        """The retained request with this handle id, if it still is."""
        program = self._owner.get(handle_id)
        return None if program is None else self._fifos[program].get(handle_id)

    def remove(self, handle: RequestHandle) -> tuple[PendingRequest, bool] | None:
        """Take a retained request out from anywhere; returns it and whether it was the front."""
        program = self._owner.pop(handle.id, None)
        if program is None:
            return None
        self._deadlines.pop(handle.id, None)
        fifo = self._fifos[program]
        was_front = next(iter(fifo)) == handle.id
        request = fifo.pop(handle.id)
        if not fifo:
            del self._fifos[program]
        return request, was_front

    def requests(self, program: Program) -> list[PendingRequest]:
        fifo = self._fifos.get(program)
        return list(fifo.values()) if fifo is not None else []
