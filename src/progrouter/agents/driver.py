"""The one Program driver: when the scheduler is ticked, and where each of its outcomes goes.

The scheduler decides on explicit times and queues what it decided (``take_outcomes``); a shell owns the
clock, the sockets and whoever waits for an answer. Between them sits this driver, sans-I/O like the
scheduler, so the server's gate (``time.monotonic()`` and an asyncio sleep) and the simulator (its virtual
clock) drive the scheduler the same way:

- outcomes are drained after every call that can produce them (a completion often admits the next Program),
  each handed to the waiter the shell registered at arrival; a dispatch nobody takes any more is completed as
  failed at once, so it holds no capacity;
- the scheduler is ticked every ``interval`` (the periodic tick, which first reports residency when the shell
  has it) and at its ``next_deadline()``; after each drain the shell is told to re-arm its wake-up, and
  ``deadline_before`` says whether the deadline now comes before the wake-up it armed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from progrouter.program import (
    BackendObservation,
    Dispatched,
    ObservationEpoch,
    Outcome,
    ProgramDispatch,
    ProgramRequest,
    ProgramScheduler,
    RequestHandle,
    ResidencyReport,
    UsageObservation,
)

W = TypeVar("W")
#: Hand an outcome to its waiter; False when the waiter no longer takes it (it left).
Hand = Callable[[W, Outcome], bool]
#: The residency reports of the Programs the shell samples, per (model pool, Program ID); None: no sampling.
ResidencyReports = Callable[[], Mapping[tuple[str, str], ResidencyReport] | None]


def _nothing() -> None:
    return None


class ProgramDriver(Generic[W]):
    """Feeds one ``ProgramScheduler`` the shell's ``now`` and hands its outcomes to the shell's waiters."""

    def __init__(
        self,
        scheduler: ProgramScheduler,
        interval: float,
        hand: Hand[W],
        *,
        residency: ResidencyReports = _nothing,
        rearm: Callable[[], None] = _nothing,
    ) -> None:
        self.scheduler = scheduler
        self.interval = interval
        self.waiters: dict[RequestHandle, W] = {}
        self.last_tick = float("-inf")
        self.next_tick = float("inf")  # the next periodic tick; ``start`` sets it
        self._hand = hand
        self._residency = residency
        self._rearm = rearm

    def start(self, now: float) -> None:
        """The shell's clock starts: the first periodic tick is one interval away."""
        self.next_tick = now + self.interval

    # ----------------------------------------------------------------------------------------- requests
    def arrive(self, now: float, request: ProgramRequest, waiter: W) -> RequestHandle:
        """Hand a request to the scheduler; its outcome goes to ``waiter`` (perhaps before this returns)."""
        handle = self.scheduler.arrive(now, request)
        self.waiters[handle] = waiter
        self.drain(now)
        return handle

    def withdraw(self, now: float, handle: RequestHandle) -> None:
        """The waiter left before its outcome: forget it and cancel its request (``drain`` after)."""
        self.waiters.pop(handle, None)
        self.scheduler.cancel(now, handle)

    def complete(
        self,
        now: float,
        dispatch: ProgramDispatch,
        *,
        success: bool,
        usage: UsageObservation | None,
        decode_seconds: float | None = None,
    ) -> None:
        """A dispatched request ended (``usage`` as its response reported it, None when unknown)."""
        self.scheduler.complete(now, dispatch, success=success, usage=usage, decode_seconds=decode_seconds)
        self.drain(now)

    def drain(self, now: float) -> None:
        """Hand every outcome to its waiter; a dispatch nobody takes any more is completed as failed."""
        scheduler = self.scheduler
        while outcomes := scheduler.take_outcomes():
            for outcome in outcomes:
                waiter = self.waiters.pop(outcome.handle, None)
                taken = waiter is not None and self._hand(waiter, outcome)
                if not taken and isinstance(outcome, Dispatched):
                    scheduler.complete(now, outcome.dispatch, success=False, usage=None)
        self._rearm()  # deadlines may have moved

    # ---------------------------------------------------------------------------------------- observing
    def begin_observation(self, now: float) -> ObservationEpoch:
        """Before the shell scrapes the Ranks (``apply_observations`` with what it read)."""
        return self.scheduler.begin_observation(now)

    def apply_observations(
        self, now: float, epoch: ObservationEpoch, observations: Mapping[str, BackendObservation]
    ) -> None:
        self.scheduler.apply_observations(now, epoch, observations)
        self.drain(now)

    # ------------------------------------------------------------------------------------------- timing
    def tick(self, now: float) -> None:
        """A deadline came: tick the scheduler and hand out what it decided."""
        self.last_tick = now
        self.scheduler.tick(now)
        self.drain(now)

    def periodic(self, now: float) -> None:
        """The periodic tick: residency reports first (when the shell samples them), then ``tick``."""
        reports = self._residency()
        if reports is not None:
            self.scheduler.observe_residency(now, reports)
        self.tick(now)
        self.next_tick = now + self.interval

    def wake(self, now: float) -> None:
        """The shell woke at ``now`` for ``wake_at``: the periodic tick once it is due, else a deadline's."""
        if now >= self.next_tick:
            self.periodic(now)
        else:
            self.tick(now)

    def wake_at(self) -> float:
        """When the shell should wake next: the periodic tick or the next deadline after the last tick."""
        deadline = self.scheduler.next_deadline()
        if deadline is not None and deadline > self.last_tick:
            return min(self.next_tick, deadline)
        return self.next_tick

    def deadline_before(self, when: float) -> float | None:
        """The scheduler's next deadline if it falls after the last tick and before ``when`` (the wake-up the
        shell armed), else None: a deadline that moved later needs no earlier wake-up."""
        deadline = self.scheduler.next_deadline()
        if deadline is not None and self.last_tick < deadline < when:
            return deadline
        return None
