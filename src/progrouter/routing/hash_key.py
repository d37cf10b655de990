"""The native consistent-hash key of a request (upstream ``policies/hash_key.rs``).

Priority: a session-like header, then a session/user field of the JSON body, then the body itself (its
CRC-32 when longer than 100 bytes: the ring hashes the key again, so the digest only has to tell bodies
apart, and CRC-32 does that for an agent's 400 kB body in a quarter of blake2b's time). Program binding
reuses this key as the second half of its placement hash key, so a Program and the plain requests of the
same ``x-session-id`` land on the same Rank.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

from multidict import CIMultiDict, CIMultiDictProxy

SESSION_HEADER_NAMES: tuple[str, ...] = (
    "x-session-id",
    "x-user-id",
    "x-tenant-id",
    "x-correlation-id",  # per session: before the per-request ids
    "x-request-id",
    "x-trace-id",
)
# Body fields after ``session_params.session_id`` (key prefix "session"), in priority order.
_BODY_FIELDS: tuple[tuple[str, str], ...] = (("user", "user"), ("session_id", "session"), ("user_id", "user"))
_LONG_BODY_BYTES = 100
# The key of a long body when its digest is not asked for (``native_hash_key(digest=False)``).
UNDIGESTED_BODY_KEY = "request_hash:undigested"
_ANY_CASE = (CIMultiDictProxy, CIMultiDict)


def is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    """``isinstance(value, Mapping)``, with the parsed-JSON cases (a dict, an absent field) first: the ABC
    check is slow."""
    return type(value) is dict or (value is not None and isinstance(value, Mapping))


def answers_any_case(headers: Mapping[str, str]) -> bool:
    """Whether ``headers`` finds a name in any case itself (aiohttp's multidicts; a plain dict does not)."""
    return isinstance(headers, _ANY_CASE)


def _header_lookup(headers: Mapping[str, str]) -> Callable[[str], str | None]:
    """A case-insensitive lookup of a lower-case header name in ``headers``."""
    if answers_any_case(headers):
        return headers.get

    def lookup(name: str) -> str | None:  # plain dicts are case-sensitive
        value = headers.get(name)
        if value is None:
            value = next((v for k, v in headers.items() if k.lower() == name), None)
        return value

    return lookup


def _identifier(value: Any) -> str | None:
    """Strings and integers identify a session; anything else (objects, bools, empty strings) does not."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def header_hash_key(headers: Mapping[str, str]) -> str | None:
    """``header:<name>:<value>`` for the first session-like header present, else None."""
    lookup = _header_lookup(headers)
    for name in SESSION_HEADER_NAMES:
        value = lookup(name)
        if value:
            return f"header:{name}:{value}"
    return None


def body_hash_key(body: Mapping[str, Any] | None) -> str | None:
    """``session:<id>`` or ``user:<id>`` from the first session/user field of the body, else None."""
    if body is None:
        return None
    params = body.get("session_params")
    if params is not None and is_mapping(params):
        ident = _identifier(params.get("session_id"))
        if ident is not None:
            return f"session:{ident}"
    for name, prefix in _BODY_FIELDS:
        value = body.get(name)
        if value is not None:  # the usual case: the field is absent
            ident = _identifier(value)
            if ident is not None:
                return f"{prefix}:{ident}"
    return None


def native_hash_key(
    headers: Mapping[str, str], body: Mapping[str, Any] | None, raw_body: bytes, *, digest: bool = True
) -> str:
    """The consistent_hash key: header, then body field, then the body itself. ``digest=False``: a caller
    that will not read a long body's key gets ``UNDIGESTED_BODY_KEY`` in place of its digest (an agent's
    400 kB body costs ~0.1 ms to digest)."""
    key = header_hash_key(headers) or body_hash_key(body)
    if key is not None:
        return key
    if len(raw_body) > _LONG_BODY_BYTES:
        return f"request_hash:{zlib.crc32(raw_body):08x}" if digest else UNDIGESTED_BODY_KEY
    return f"request:{raw_body.decode('utf-8', 'replace')}"
