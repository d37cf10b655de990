"""Dispatch: an Active Program's retained requests go to its placement, front first, as ``Dispatched``
outcomes; the scheduler remembers each until its completion."""

from __future__ import annotations

from typing import TYPE_CHECKING

from progrouter.program.ledger import program_private_tokens
from progrouter.program.outcomes import Dispatched, ProgramDispatch

if TYPE_CHECKING:
    from progrouter.program.state import Program
    from progrouter.program.views import Dispatching


def serve_active(core: Dispatching, program: Program, now: float) -> None:
    """A request of an Active Program: charge its grown demand (unless repair marked it to pause) and
    dispatch at once — its KV is treated as resident, no admission check."""
    if not program.pause_when_idle:
        demand = program_private_tokens(program, core.config.decode_buffer_tokens)
        if demand > program.charged_tokens:
            core.ledger.recharge(program, demand)
    dispatch_retained(core, program, now)


def dispatch_retained(core: Dispatching, program: Program, now: float) -> None:
    """Send every retained request of an Active Program to its placement, front first."""
    target_id = program.placement
    assert target_id is not None
    target = core.targets[target_id]
    observer = core.observer if core.observing else None
    debugging = core.debugging
    for request in core.pool.take_all(program):
        first = core.table.dispatched(program)
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
        core.outstanding[request.handle.id] = dispatch
        core.outcomes.append(Dispatched(request.handle, dispatch))
        core.binder.commit(request.routing_text, target_id)
        if observer is not None:
            observer.histogram("queue_wait_seconds", queued, target=target_id)
        if debugging:
            core.observer.event(
                "debug",
                "request_dispatch",
                program=program.redacted,
                program_id=program.ref.program_id,
                target=target_id,
                queued_seconds=queued,
                placement_start=first,
            )
