"""JSON error bodies in the OpenAI shape, so clients of any worker parse router errors the same way.

Every refusal the router makes uses this shape — handler errors, aiohttp's own ``HTTPException``s (through
``http_error``) and the answers the connection guard writes before any request exists (``raw_error``).
"""

from __future__ import annotations

from http import HTTPStatus

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "request_timeout",
    413: "request_too_large",
    429: "rate_limit_error",
    431: "request_too_large",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "gateway_timeout",
}


def error_type(status: int) -> str:
    return _TYPES.get(status, "internal_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str) -> bytes:
    """``{"error": {"message", "type", "code"}}``."""
    return orjson.dumps({"error": {"message": message, "type": error_type(status), "code": status}})


def json_error(status: int, message: str, *, close: bool = False) -> web.Response:
    """The error as a response; ``close`` ends the connection after it (the request was not read whole)."""
    response = web.Response(status=status, body=error_body(status, message), content_type="application/json")
    if close:
        response.force_close()
    return response


def json_response(data: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


def raw_error(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 error response that closes the connection, for when no request object exists."""
    body = error_body(status, message)
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def http_error(exc: web.HTTPException) -> web.Response:
    """aiohttp's ``HTTPException`` (413 from ``read()``, 405, …) answered in the JSON shape."""
    return json_error(exc.status, exc.reason, close=True)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``http_error`` as a middleware (the EPP's app; the router's edge calls it directly)."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return http_error(exc)
