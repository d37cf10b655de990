"""Request ids: read from the client's headers or made up, echoed, forwarded, and on every log line.

The id is the value of the first header of ``request_id_headers`` the request carries (upstream's default
list: ``x-request-id``, ``x-correlation-id``, ``x-trace-id``, ``request-id``); without one, a new id of
upstream's shape (``chatcmpl-``, ``cmpl-``, ``gnt-`` or ``req-`` by route, then 24 letters and digits).
Every response answers it as ``X-Request-ID`` (streams too: the edge adds it to every response head); the
proxy sends it on to the worker as ``X-Request-ID`` (upstream forwards only the client's own header); and
it is held in a context variable that ``RequestIdFilter`` puts on log records, so every line logged while
serving the request names it.
"""

from __future__ import annotations

import contextvars
import logging
import random
import string
from collections.abc import Mapping, Sequence

DEFAULT_HEADERS: tuple[str, ...] = ("x-request-id", "x-correlation-id", "x-trace-id", "request-id")
HEADER = "X-Request-ID"
MAX_ID_CHARS = 256  # a longer client value is replaced, so logs and headers stay bounded
_ALPHABET = string.ascii_letters + string.digits
_PREFIXES = {
    "/v1/chat/completions": "chatcmpl-",
    "/v1/completions": "cmpl-",
    "/generate": "gnt-",
    "/inference/v1/generate": "gnt-",
}
REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("progrouter_request_id", default=None)


# Each random byte b becomes _ALPHABET[b % 62], as one C-level translate of the bytes.
_BYTE_TO_CHAR = bytes(ord(_ALPHABET[b % 62]) for b in range(256))


def new_request_id(path: str) -> str:
    """24 random letters and digits: a mapping of pseudo-random bytes, 15x cheaper than ``secrets.choice``.
    An id names a request and guards nothing, so it needs no OS randomness (``os.urandom`` is a getrandom
    system call per request); ``random`` reseeds itself in a forked process."""
    return _PREFIXES.get(path, "req-") + random.randbytes(24).translate(_BYTE_TO_CHAR).decode("ascii")


def pick_request_id(headers: Mapping[str, str], names: Sequence[str], path: str) -> str:
    """The first usable value among the headers ``names``, else a new id."""
    for name in names:
        value = headers.get(name)
        if value is not None and 0 < len(value) <= MAX_ID_CHARS and value.isprintable():
            return value
    return new_request_id(path)


def header_names(names: Sequence[str] | None) -> tuple[str, ...]:
    """The headers an id is read from, in order and lower-case (upstream's list when none are configured)."""
    return tuple(n.lower() for n in names) if names else DEFAULT_HEADERS


class RequestIdFilter(logging.Filter):
    """Sets ``record.request_id`` (``-`` outside a request); attach it to a handler whose format uses it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get() or "-"
        return True
