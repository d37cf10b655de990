"""The client edge: one middleware that puts every request through the router's checks, in order.

1. a request id (``request_id``), on the context for every log line and echoed on the response;
2. aiohttp's own ``HTTPException``s answered in the JSON error shape (``errors``), for all that follows;
3. headers holding CR, LF or NUL refused (``headers``);
4. unknown callers refused, and the ``Authorization`` a worker sees set (``auth``);
5. while draining, new work refused; work in progress counted (``drain``; introspection is exempt);
6. the body read whole within its deadline, or refused as slow, oversize or malformed (``connection``).

One middleware rather than a chain of six: each link of aiohttp's chain is a coroutine per request, and on a
router whose whole job is a few hundred microseconds per request that shows. The rules stay in their
modules; this one only fixes the order.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from progrouter.config import RouterConfig
from progrouter.server.auth import AccessPolicy, screen
from progrouter.server.connection import body_reader
from progrouter.server.drain import answered_in_drain, drain_exempt, drain_refusal
from progrouter.server.errors import http_error
from progrouter.server.headers import header_refusal
from progrouter.server.request_id import REQUEST_ID, install_request_ids
from progrouter.server.state import STATE_KEY


def install_edge(app: web.Application, config: RouterConfig) -> None:
    """The edge as ``app``'s outermost middleware."""
    assign_id = install_request_ids(app, config.request_id_headers)
    access = AccessPolicy.from_config(config)
    read_body = body_reader(config)

    @web.middleware
    async def edge(request: web.Request, handler: Handler) -> web.StreamResponse:
        token = REQUEST_ID.set(assign_id(request))
        try:
            refused = header_refusal(request)
            if refused is not None:
                return refused
            screened = screen(access, request)
            if isinstance(screened, web.Response):
                return screened
            if drain_exempt(screened):
                return await read_body(screened) or await handler(screened)
            state = screened.app[STATE_KEY]
            refused = drain_refusal(state)
            if refused is not None:
                return refused
            state.request_started()
            try:
                response = await read_body(screened) or await handler(screened)
            finally:
                state.request_finished()
            return answered_in_drain(state, response)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return http_error(exc)
        finally:
            REQUEST_ID.reset(token)

    middleware: Middleware = edge
    app.middlewares.insert(0, middleware)
