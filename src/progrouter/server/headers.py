"""Which headers cross the proxy, in each direction (RFC 9110 §7.6.1 hop-by-hop rules)."""

from __future__ import annotations

from collections.abc import Mapping

from multidict import CIMultiDict, CIMultiDictProxy

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


def _connection_tokens(headers: Mapping[str, str]) -> frozenset[str]:
    value = headers.get("Connection")
    return frozenset(t.strip().lower() for t in value.split(",")) if value else frozenset()


def request_headers(
    incoming: CIMultiDictProxy[str], api_key: str | None, default_content_type: str | None
) -> CIMultiDict[str]:
    """Client headers to send on to a worker (without the Rank header, which each attempt adds)."""
    drop = _REQUEST_DROP | _connection_tokens(incoming)
    out: CIMultiDict[str] = CIMultiDict((k, v) for k, v in incoming.items() if k.lower() not in drop)
    if api_key is not None:
        out["Authorization"] = f"Bearer {api_key}"
    if default_content_type is not None and "Content-Type" not in out:
        out["Content-Type"] = default_content_type
    return out


def response_headers(upstream: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """Worker response headers to relay to the client."""
    drop = _RESPONSE_DROP | _connection_tokens(upstream)
    return CIMultiDict((k, v) for k, v in upstream.items() if k.lower() not in drop)
