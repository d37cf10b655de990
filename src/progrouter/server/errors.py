"""JSON error bodies in the OpenAI shape, so clients of any worker parse router errors the same way."""

from __future__ import annotations

import orjson
from aiohttp import web

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "gateway_timeout",
}


def error_type(status: int) -> str:
    return _TYPES.get(status, "internal_error" if status >= 500 else "invalid_request_error")


def json_error(status: int, message: str) -> web.Response:
    """``{"error": {"message", "type", "code"}}`` with ``status``."""
    body = {"error": {"message": message, "type": error_type(status), "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def json_response(data: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")
