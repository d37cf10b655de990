"""CORS for browser clients (``cors_allowed_origins``), answered as upstream's tower-http layer does.

With origins configured: a preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) is
answered 200 by the router itself with ``Allow-Methods: GET,POST,OPTIONS``, the requested headers mirrored,
``Max-Age: 3600``, and ``Allow-Origin`` only when the origin is listed; every other response (streams too:
the headers are added as it is prepared) carries ``Allow-Origin`` for a listed origin and exposes
``x-request-id``. ``*`` in the list allows any origin.

With no origins configured no CORS header is sent, so browsers keep the same-origin rule. Upstream 0.1.17
answers ``Access-Control-Allow-Origin: *`` on every response in that case (observed), which lets a page on
any site read the answers of a router it can reach (say, on localhost); list ``*`` to get that behaviour.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping, Sequence

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
VARY = "origin, access-control-request-method, access-control-request-headers"
ALLOW_METHODS = "GET,POST,OPTIONS"
MAX_AGE = "3600"
EXPOSE = "x-request-id"


class Cors:
    def __init__(self, origins: Sequence[str]) -> None:
        self.origins = frozenset(origins)

    def headers(self, origin: str | None) -> dict[str, str]:
        """``Vary`` and, for an allowed origin, ``Access-Control-Allow-Origin``."""
        out = {"Vary": VARY}
        if "*" in self.origins:
            out["Access-Control-Allow-Origin"] = "*"
        elif origin is not None and origin in self.origins:
            out["Access-Control-Allow-Origin"] = origin
        return out

    @web.middleware
    async def preflight(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "OPTIONS" or "Access-Control-Request-Method" not in request.headers:
            return await handler(request)
        headers = self.headers(request.headers.get("Origin"))
        headers["Access-Control-Allow-Methods"] = ALLOW_METHODS
        headers["Access-Control-Allow-Headers"] = request.headers.get("Access-Control-Request-Headers", "")
        headers["Access-Control-Max-Age"] = MAX_AGE
        return web.Response(status=200, headers=headers)

    def decorate(self, headers: MutableMapping[str, str], origin: str | None) -> None:
        """Add the CORS headers to a response's ``headers`` (a preflight's are already complete)."""
        if "Access-Control-Max-Age" in headers:
            return
        headers.update(self.headers(origin))
        headers["Access-Control-Expose-Headers"] = EXPOSE


def install_cors(app: web.Application, cors: Cors | None) -> None:
    """Nothing at all without origins; else the preflight middleware (the edge decorates every answer)."""
    if cors is not None:
        app.middlewares.append(cors.preflight)
