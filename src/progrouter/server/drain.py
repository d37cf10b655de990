"""Graceful drain on SIGTERM: stop taking work, let what is running finish, then stop.

Once draining, ``/readiness`` says 503 (so a load balancer stops sending), every new request is answered 503
with ``Retry-After`` (it is safe to send again, to another replica), Program requests still waiting in the
RequestPool get the same retryable 503, and requests already forwarded (streams included) may finish until
``drain_timeout_secs``. The middleware counts requests in progress so the drain knows when none is left.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from progrouter.server.errors import json_error
from progrouter.server.state import STATE_KEY, RouterState

log = logging.getLogger("progrouter.router")

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


@web.middleware
async def drain_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse new requests while draining; count the ones in progress."""
    if request.method == "GET" and request.path in INTROSPECTION:
        return await handler(request)
    state = request.app[STATE_KEY]
    if state.draining:
        return _retryable(json_error(503, "the router is shutting down; retry the request"))
    state.request_started()
    try:
        response = await handler(request)
    finally:
        state.request_finished()
    if state.draining and response.status == 503 and not response.prepared:
        _retryable(response)
    return response


def _retryable(response: web.StreamResponse) -> web.StreamResponse:
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
