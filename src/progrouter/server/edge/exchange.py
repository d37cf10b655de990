"""One client request as the proxy and the edge see it, whichever server carries it.

Two servers carry client requests: aiohttp's (every route) and the front door (``front.py``: the hot proxied
POST routes, below aiohttp's web layer). The edge's checks and the proxy are written once, against these
shapes; each server supplies its side. An answer is either a ``web.Response`` not yet sent (the server writes
it: errors, JSON answers) or a ``Stream`` already under way (SSE relayed chunk by chunk).
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy


class Head(Protocol):
    """What every reader of a client request sees: its method, path and headers."""

    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def headers(self) -> CIMultiDictProxy[str]: ...


class Inbound(Head, Protocol):
    """What the edge's checks read of a request (``web.BaseRequest`` has exactly these)."""

    @property
    def raw_headers(self) -> tuple[tuple[bytes, bytes], ...]: ...
    @property
    def body_exists(self) -> bool: ...


class Stream(Protocol):
    """A streamed answer whose head is out (``web.StreamResponse`` once prepared has exactly these)."""

    @property
    def status(self) -> int: ...
    @property
    def prepared(self) -> bool: ...
    async def write(self, data: bytes) -> None: ...
    async def write_eof(self, data: bytes = b"") -> None: ...


# A web.Response not yet sent, or a Stream already under way (a prepared web.StreamResponse is one).
Answer = web.StreamResponse | Stream


class Exchange(Head, Protocol):
    """One proxied request: its head, its body (read whole by the edge), how to start a streamed answer."""

    @property
    def path_qs(self) -> str: ...
    @property
    def body(self) -> bytes: ...
    async def stream(self, status: int, headers: CIMultiDict[str]) -> Stream:
        """Send the head of a streamed answer (chunked); the caller writes the chunks and the end."""
        ...

    def abort(self) -> None:
        """Cut the client's connection: a stream broke off after its head was sent."""


class AiohttpExchange:
    """An aiohttp request as an ``Exchange``."""

    __slots__ = ("_request", "body", "headers", "method", "path", "path_qs")

    def __init__(self, request: web.Request, body: bytes) -> None:
        self._request = request
        self.method = request.method
        self.path = request.path
        self.path_qs = request.path_qs
        self.headers = request.headers
        self.body = body

    async def stream(self, status: int, headers: CIMultiDict[str]) -> Stream:
        response = web.StreamResponse(status=status, headers=headers)
        await response.prepare(self._request)
        return response

    def abort(self) -> None:
        if self._request.transport is not None:
            self._request.transport.close()
