"""Graceful drain on SIGTERM: stop taking work, let what is running finish, then stop.

Once draining, ``/readiness`` says 503 (so a load balancer stops sending), every new request is answered 503
with ``Retry-After`` (it is safe to send again, to another replica), Program requests still waiting in the
RequestPool get the same retryable 503, and requests already forwarded (streams included) may finish until
``drain_timeout_secs``. The edge (``middleware.py``) counts requests in progress so the drain knows when none
is left.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TypeVar

from aiohttp import web

from progrouter.server.edge.errors import json_error
from progrouter.server.edge.exchange import Answer, Inbound
from progrouter.server.state import RouterState

log = logging.getLogger("progrouter.router")
R = TypeVar("R", bound=web.StreamResponse)

# Answered by the router itself, from memory, also while draining (an operator watches the drain with them).
INTROSPECTION = frozenset(
    {
        "/health",
        "/readiness",
        "/liveness",
        "/scheduling/diagnostics",
        "/list_workers",
        "/get_loads",
        "/workers",
    }
)
RETRY_AFTER_SECONDS = "1"


def drain_exempt(request: Inbound) -> bool:
    """Answered from memory and never refused by the drain (nor counted by it)."""
    return request.method == "GET" and request.path in INTROSPECTION


def drain_refusal(state: RouterState) -> web.Response | None:
    """The retryable 503 while draining (None: the request may start; the edge then counts it)."""
    return (
        _retryable(json_error(503, "the router is shutting down; retry the request"))
        if state.draining
        else None
    )


def answered_in_drain(state: RouterState, response: Answer) -> Answer:
    """A counted request is done; a 503 answered during the drain says when to retry."""
    if state.draining and isinstance(response, web.Response) and response.status == 503:
        _retryable(response)
    return response


def _retryable(response: R) -> R:
    response.headers.setdefault("Retry-After", RETRY_AFTER_SECONDS)
    return response


async def drain(state: RouterState, timeout: float) -> bool:
    """Start draining and wait up to ``timeout`` seconds for in-progress requests; True if all finished."""
    state.draining = True
    shed = state.gate.shed_waiting() if state.gate is not None else 0
    log.info(
        "draining: %d request(s) in progress, %d pooled Program request(s) answered 503; waiting up to %gs",
        state.active_requests,
        shed,
        timeout,
    )
    try:
        await asyncio.wait_for(state.idle.wait(), timeout)
    except TimeoutError:
        log.warning("drain timeout: %d request(s) still in progress are cut off", state.active_requests)
        return False
    return True
