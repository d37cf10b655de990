"""Which headers cross the proxy, in each direction (RFC 9110 §7.6.1 hop-by-hop rules), and which are refused.

A header name or value holding CR, LF or NUL is refused with 400 before anything else reads it: relayed to a
worker it could split into a second header (the one that picks the Rank, say). aiohttp's strict parser
rejects most of these already; this check keeps the guarantee whatever parser (or version) is in use.
"""

from __future__ import annotations

from itertools import chain

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from progrouter.server.edge.errors import json_error
from progrouter.server.edge.exchange import Inbound

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Recomputed by our side of each connection. Accept-Encoding is dropped so a worker never compresses what
# usage accounting must read; the response body is relayed byte for byte.
_REQUEST_DROP = HOP_BY_HOP | {"host", "content-length", "accept-encoding"}
_RESPONSE_DROP = HOP_BY_HOP | {"content-length", "date", "server"}


def _prune(headers: CIMultiDict[str], drop: frozenset[str]) -> CIMultiDict[str]:
    """``headers`` without ``drop`` and without what its ``Connection`` header names (changed in place)."""
    connection = headers.get("Connection")
    if connection:
        drop = drop | {t.strip().lower() for t in connection.split(",")}
    for name in drop:
        if name in headers:
            headers.popall(name)
    return headers


def request_headers(incoming: CIMultiDictProxy[str], default_content_type: str | None) -> CIMultiDict[str]:
    """Client headers to send on to a worker (without the Rank header, which each attempt adds).

    ``Authorization`` is whatever the access-control middleware left on the request (see ``auth``). Copied
    whole (in C) and then pruned: cheaper than filtering field by field in Python.
    """
    out = _prune(CIMultiDict(incoming), _REQUEST_DROP)
    if default_content_type is not None and "Content-Type" not in out:
        out["Content-Type"] = default_content_type
    return out


def response_headers(upstream: CIMultiDict[str]) -> CIMultiDict[str]:
    """Worker response headers to relay to the client: ``upstream``, pruned in place (the worker client
    parsed them for this answer alone)."""
    return _prune(upstream, _RESPONSE_DROP)


def header_violation(raw_headers: tuple[tuple[bytes, bytes], ...]) -> str | None:
    """Why these headers are refused (None if they are not); the reason names no header content."""
    blob = b"".join(chain.from_iterable(raw_headers))  # one scan of all the headers, then find which
    if b"\r" not in blob and b"\n" not in blob and b"\0" not in blob:
        return None
    for index, (name, value) in enumerate(raw_headers):
        if (
            b"\r" in name
            or b"\n" in name
            or b"\0" in name
            or b"\r" in value
            or b"\n" in value
            or b"\0" in value
        ):
            return f"header #{index + 1} holds a CR, LF or NUL character"
    return None


def header_refusal(request: Inbound) -> web.Response | None:
    """The 400 for a request whose headers hold CR, LF or NUL (None: let it through)."""
    reason = header_violation(request.raw_headers)
    return None if reason is None else json_error(400, reason, close=True)
