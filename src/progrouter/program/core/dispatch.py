"""Dispatch: an Active Program's retained requests go to its placement, front first, as ``Dispatched``
outcomes; the ``Outbox`` remembers each until its completion."""

from __future__ import annotations

from typing import TYPE_CHECKING

from progrouter.program.core.demand import program_private_tokens
from progrouter.program.outcomes import ProgramDispatch

if TYPE_CHECKING:
    from progrouter.config import ProgramSchedulingConfig
    from progrouter.program.core.binding import Binder
    from progrouter.program.core.fleet import Fleet
    from progrouter.program.core.ledger import CapacityLedger
    from progrouter.program.core.request_pool import RequestPool
    from progrouter.program.core.state import Program
    from progrouter.program.core.table import ProgramTable
    from progrouter.program.core.telemetry import Telemetry
    from progrouter.program.outcomes import Outbox


class Dispatcher:
    __slots__ = (
        "_binder",
        "_decode_buffer",
        "_fleet",
        "_ledger",
        "_outbox",
        "_request_pool",
        "_table",
        "_telemetry",
    )

    def __init__(
        self,
        config: ProgramSchedulingConfig,
        telemetry: Telemetry,
        table: ProgramTable,
        request_pool: RequestPool,
        ledger: CapacityLedger,
        fleet: Fleet,
        binder: Binder,
        outbox: Outbox,
    ) -> None:
        self._decode_buffer = config.decode_buffer_tokens
        self._telemetry = telemetry
        self._table = table
        self._request_pool = request_pool
        self._ledger = ledger
        self._fleet = fleet
        self._binder = binder
        self._outbox = outbox

    def serve_active(self, program: Program, now: float) -> None:
        """A request of an Active Program: charge its grown demand (unless repair marked it to pause) and
        dispatch at once — its KV is treated as resident, no admission check."""
        if not program.pause_when_idle:
            demand = program_private_tokens(program, self._decode_buffer)
            if demand > self._ledger.charged(program):
                self._ledger.recharge(program, demand)
        self.dispatch_retained(program, now)

    def dispatch_retained(self, program: Program, now: float) -> None:
        """Send every retained request of an Active Program to its placement, front first."""
        rank_id = program.placement
        assert rank_id is not None
        target = self._fleet.targets[rank_id]
        telemetry = self._telemetry
        observer = telemetry.observer if telemetry.observing else None
        debugging = telemetry.debugging
        table, outbox, binder = self._table, self._outbox, self._binder
        for request in self._request_pool.take_all(program):
            first = table.dispatched(program)
            queued = max(0.0, now - request.arrived_at)
            dispatch = ProgramDispatch(  # (by position: keywords cost a dict per request)
                request.handle,
                target,
                program.ref,
                program.placement_epoch,
                request.estimated_context_tokens,
                request.arrived_at,
                now,  # dispatched at
                queued,
                request.hints,
                first,  # the placement's first request
            )
            outbox.dispatched(dispatch)
            binder.commit(request.routing_text, rank_id)
            if observer is not None:
                observer.histogram("queue_wait_seconds", queued, target=rank_id)
            if debugging:
                telemetry.observer.event(
                    "debug",
                    "request_dispatch",
                    program=program.redacted,
                    program_id=program.ref.program_id,
                    target=rank_id,
                    queued_seconds=queued,
                    placement_start=first,
                )
