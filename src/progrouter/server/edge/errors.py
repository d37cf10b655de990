"""JSON error bodies in the shape of the API the client speaks, so it parses router errors as a worker's.

Every refusal the router makes uses this module — handler errors, aiohttp's own ``HTTPException``s (through
``http_error``) and the answers the connection guard writes before any request exists (``raw_error``). The
shape is OpenAI's ``{"error": {"message", "type", "code"}}`` unless the request being answered is on an
Anthropic Messages route (``ANTHROPIC_ROUTES``): then it is Anthropic's
``{"type": "error", "error": {"type", "message"}}``, as vLLM's own Messages routes answer. The edge sets the
shape per request (``ERROR_SHAPE``) before any check runs, so every refusal of that request agrees.
"""

from __future__ import annotations

import contextvars
from enum import Enum
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
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}
ANTHROPIC_ROUTES = frozenset({"/v1/messages", "/v1/messages/count_tokens"})


class ErrorShape(Enum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


# The shape of the request being answered (a context variable, like the request id: set once per request).
ERROR_SHAPE: contextvars.ContextVar[ErrorShape] = contextvars.ContextVar(
    "progrouter_error_shape", default=ErrorShape.OPENAI
)


def shape_for(path: str) -> ErrorShape:
    """The error shape of a route: Anthropic's on the Messages routes, OpenAI's everywhere else."""
    return ErrorShape.ANTHROPIC if path in ANTHROPIC_ROUTES else ErrorShape.OPENAI


def error_type(status: int) -> str:
    return _TYPES.get(status, "internal_error" if status >= 500 else "invalid_request_error")


def anthropic_error_type(status: int) -> str:
    return _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str) -> bytes:
    """``{"error": {"message", "type", "code"}}``, or Anthropic's ``{"type": "error", "error": {"type",
    "message"}}`` while a Messages request is answered."""
    if ERROR_SHAPE.get() is ErrorShape.ANTHROPIC:
        return orjson.dumps(
            {"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}
        )
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
