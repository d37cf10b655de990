"""The client edge: every request goes through the router's checks, in order, whichever server carries it.

1. a request id (``request_id``), on the context for every log line and echoed on the response, and the
   error shape of its API (``errors.ERROR_SHAPE``), so every refusal below answers in that API's shape;
2. aiohttp's own ``HTTPException``s answered in the JSON error shape (``errors``), for all that follows;
3. headers holding CR, LF or NUL refused (``headers``);
4. unknown callers refused, and the ``Authorization`` a worker sees set (``auth``);
5. while draining, new work refused; work in progress counted (``drain``; introspection is exempt);
6. the body read whole within its deadline, or refused as slow, oversize or malformed (``connection``).

Every answer's head then gets the request id and the CORS headers (``Edge.decorate``).

``Edge.admit`` holds the order once; aiohttp's server calls it from one middleware (rather than a chain of
six: each link of aiohttp's chain is a coroutine per request, and on a router whose whole job is a few
hundred microseconds per request that shows), the front door (``front.py``) calls it directly. The rules
stay in their modules; this one only fixes the order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from multidict import CIMultiDict

from progrouter.config import RouterConfig
from progrouter.server.edge.auth import AccessPolicy, screen, screened
from progrouter.server.edge.connection import body_reader
from progrouter.server.edge.cors import Cors, install_cors
from progrouter.server.edge.drain import answered_in_drain, drain_exempt, drain_refusal
from progrouter.server.edge.errors import ERROR_SHAPE, ErrorShape, http_error, shape_for
from progrouter.server.edge.exchange import Answer, Inbound
from progrouter.server.edge.headers import header_refusal
from progrouter.server.edge.request_id import HEADER, REQUEST_ID, header_names, pick_request_id
from progrouter.server.state import RouterState

# The body reader: None when the body is in, else the refusal.
BodyRead = Callable[[], Awaitable[web.Response | None]]
# The route: called with the headers ``auth`` set for the worker (None: the request's own).
Route = Callable[[CIMultiDict[str] | None], Awaitable[Answer]]

_ID_KEY = web.RequestKey("progrouter_request_id", str)


class Edge:
    """The edge's checks of one router, built once from its config."""

    def __init__(self, config: RouterConfig, state: RouterState) -> None:
        self.state = state
        self.access = AccessPolicy.from_config(config)
        self.cors = Cors(config.cors_allowed_origins) if config.cors_allowed_origins else None
        self._id_headers = header_names(config.request_id_headers)

    def request_id(self, request: Inbound) -> str:
        return pick_request_id(request.headers, self._id_headers, request.path)

    def decorate(
        self, headers: MutableMapping[str, str], request: Mapping[str, str], rid: str | None
    ) -> None:
        """What every answer's head carries besides its own headers: the request id and CORS."""
        if rid is not None:
            headers[HEADER] = rid
        if self.cors is not None:
            self.cors.decorate(headers, request.get("Origin"))

    async def admit(self, request: Inbound, read_body: BodyRead, route: Route) -> Answer:
        """Steps 3-6 in order, then ``route``; the caller has set the request id (step 1)."""
        refused = header_refusal(request)
        if refused is not None:
            return refused
        outcome = screen(self.access, request)
        if outcome is not None and isinstance(outcome, web.Response):  # None first: an ABC check is slow
            return outcome
        if drain_exempt(request):
            return await read_body() or await route(outcome)
        state = self.state
        refused = drain_refusal(state)
        if refused is not None:
            return refused
        state.request_started()
        try:
            response = await read_body() or await route(outcome)
        finally:
            state.request_finished()
        return answered_in_drain(state, response)


EDGE_KEY = web.AppKey("progrouter_edge", Edge)


def install_edge(app: web.Application, config: RouterConfig, state: RouterState) -> Edge:
    """The edge as ``app``'s outermost middleware (and its response decoration); the front door finds it
    under ``EDGE_KEY``."""
    edge = app[EDGE_KEY] = Edge(config, state)
    read_body = body_reader(config)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        rid = request[_ID_KEY] = edge.request_id(request)
        token = REQUEST_ID.set(rid)
        shape = shape_for(request.path)
        shape_token = None if shape is ErrorShape.OPENAI else ERROR_SHAPE.set(shape)
        try:

            async def route(headers: CIMultiDict[str] | None) -> Answer:
                return await handler(screened(request, headers))

            answer = await edge.admit(request, lambda: read_body(request), route)
            assert isinstance(answer, web.StreamResponse)  # aiohttp's handlers answer aiohttp's responses
            return answer
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return http_error(exc)
        finally:
            REQUEST_ID.reset(token)
            if shape_token is not None:
                ERROR_SHAPE.reset(shape_token)

    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        edge.decorate(response.headers, request.headers, request.get(_ID_KEY))

    m: Middleware = middleware
    app.middlewares.insert(0, m)
    app.on_response_prepare.append(on_prepare)
    install_cors(app, edge.cors)
    return edge
