"""The connection guard: slow and greedy clients are cut off, and malformed HTTP is answered in JSON.

aiohttp offers ``keepalive_timeout`` (an idle connection with no request pending is closed; since 3.14 this
also covers a connection that never sends a request) and ``client_max_size`` (413), but no bound on how long a
request head or body may take, no bound on open connections, and it answers its own parser errors in plain
text. The minimum on top, per connection:

- **head deadline** (``client_header_timeout_secs``): from the first byte of a request head until the head is
  complete; past it the client gets 408 and the connection is closed (a head trickled a byte at a time);
- **body deadline** (``client_body_timeout_secs``): reading the whole body (``body_reader``); past it 408 and
  close (a body trickled, or a chunked body that never ends);
- **idle** (``client_keepalive_timeout_secs``): aiohttp's own keep-alive timer closes a connection waiting
  for its next (or first) request;
- **connection bound** (``max_client_connections``): one more is answered 503 and closed at once;
- **parser errors** (bad request line, oversize or too many headers, bad framing) get the JSON error shape
  with a fixed reason that quotes none of the client's bytes, and are logged at DEBUG only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import (
    BadHttpMessage,
    BadHttpMethod,
    BadStatusLine,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    PayloadEncodingError,
)
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from aiohttp.web_request import BaseRequest

from progrouter.config import RouterConfig
from progrouter.server.edge.errors import json_error, raw_error
from progrouter.server.edge.log_hygiene import install_aiohttp_log_filter

log = logging.getLogger("progrouter.edge")

_TOO_MANY_HEADERS = "Too many headers received"
LINGER_SECS = 2.0
TIMER_SLACK = 0.001  # a loop timer may fire this much early (millisecond resolution); the deadline has passed
BAD_FRAMING = "the request body does not match its Content-Length or Transfer-Encoding"


def parse_error_reply(exc: BaseException | None) -> tuple[int, str]:
    """Status and reason for an aiohttp parser error; the reason never quotes request bytes."""
    if isinstance(exc, LineTooLong):
        return 431, "the request line or a header field is longer than the router accepts"
    if isinstance(exc, BadHttpMethod):
        return 400, "malformed request line: unknown method"
    if isinstance(exc, BadStatusLine):
        return 400, "malformed request line"
    if isinstance(exc, InvalidURLError):
        return 400, "malformed request target"
    if isinstance(exc, InvalidHeader):
        return 400, "malformed header field"
    if isinstance(exc, PayloadEncodingError):
        return 400, BAD_FRAMING
    if isinstance(exc, BadHttpMessage):
        if exc.message == _TOO_MANY_HEADERS:
            return 431, "too many header fields"
        # llhttp's reasons are fixed text ending in ":"; the quoted bytes come after the first line.
        first = exc.message.split("\n", 1)[0]
        if "\n" in exc.message and first.endswith(":"):
            return 400, f"malformed HTTP request: {first.rstrip(':')}"
        return 400, "malformed HTTP request"
    if isinstance(exc, HttpProcessingError):
        return exc.code or 400, "malformed HTTP request"
    return 500, "internal router error"


class ConnectionGuard:
    """The limits of one listening socket, and the count of its open connections."""

    def __init__(self, config: RouterConfig) -> None:
        install_aiohttp_log_filter()  # aiohttp logs the bytes it could not parse: strip them first
        self.header_timeout = config.client_header_timeout_secs
        self.keepalive_timeout = config.client_keepalive_timeout_secs
        self.max_connections = config.max_client_connections
        # After a refusal with the body unread, what the client still sends is read and dropped for this long
        # (so it can read the refusal) before the connection closes.
        self.lingering_time = min(LINGER_SECS, config.client_body_timeout_secs)
        self.open = 0

    def admit(self) -> str | None:
        """Count one more open connection; or the reason it is refused (the bound is reached)."""
        if self.open >= self.max_connections:
            return f"the router holds its limit of {self.max_connections} client connections"
        self.open += 1
        return None

    def release(self) -> None:
        self.open -= 1

    def protocol(
        self, server: web.Server, loop: asyncio.AbstractEventLoop, kind: type[GuardedHandler] | None = None
    ) -> GuardedHandler:
        """A new connection's aiohttp protocol (``kind``: a subclass, for the front door's loans)."""
        backstop = self.keepalive_timeout + self.header_timeout  # never before the handler's own deadlines
        return (kind or GuardedHandler)(
            server,
            self,
            loop=loop,
            access_log=None,
            keepalive_timeout=backstop,
            lingering_time=self.lingering_time,
        )


class GuardedHandler(RequestHandler):
    """aiohttp's per-connection protocol, with the idle and head deadlines, the bound and JSON errors.

    One timer: while the connection waits for a request it is the idle deadline (close quietly); from the
    first byte of a head it is the head deadline (408); while a request is being answered there is none.
    aiohttp's own keep-alive timer stays as a backstop set past both.
    """

    def __init__(self, server: web.Server, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self._guard = guard
        self._counted = False
        self._deadline: asyncio.TimerHandle | None = None  # armed at or before ``_due``
        self._due: float | None = None  # loop time of the current deadline
        self._head_started = False
        self._closing = False
        self._unanswered = 0  # request heads parsed whose responses are not finished

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        refusal = self._guard.admit()
        if refusal is not None:
            self._refuse(503, refusal)
            return
        self._counted = True
        self._wait_for_head()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._counted:
            self._counted = False
            self._guard.release()
        self._due = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        before = self._request_count
        super().data_received(data)
        heads = self._request_count - before
        if heads:
            self._unanswered += heads
            self._set_deadline(None)
        elif data and self._unanswered == 0 and not self._head_started and not self._closing:
            self._head_started = True
            self._set_deadline(self._guard.header_timeout)

    async def finish_response(
        self, request: BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._unanswered = max(0, self._unanswered - 1)
            if not resp.keep_alive:  # the connection ends after aiohttp's bounded lingering read
                self._closing = True
                self._set_deadline(None)
            elif self._unanswered == 0:
                self._wait_for_head()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's error answer, in the JSON shape, logged without the request bytes."""
        if request.writer.output_size > 0:
            raise ConnectionError("a response is under way; the error cannot be sent")
        if status == 504:
            code, reason = 504, "the request handler timed out"
        elif exc is None or isinstance(exc, HttpProcessingError):
            code, reason = parse_error_reply(exc) if exc is not None else (status, "request refused")
        else:
            code, reason = 500, "internal router error"
        if code >= 500:
            log.error("%s %s answered %d: %s", request.method, request.path, code, type(exc).__name__)
        else:
            log.debug("refused a malformed request: %d %s", code, reason)
        return json_error(code, reason, close=True)

    def _wait_for_head(self) -> None:
        self._head_started = False
        self._set_deadline(self._guard.keepalive_timeout)

    def _set_deadline(self, seconds: float | None) -> None:
        """Move the deadline. Lazily: a timer already armed no later than the new deadline stays, and
        finding the deadline moved on when it fires, re-arms; on a busy keep-alive connection that is one
        timer per idle period rather than a timer armed and cancelled per request."""
        if seconds is None:
            self._due = None
            return
        due = self._due = self._loop.time() + seconds
        if self._deadline is None or self._deadline.when() > due:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self._loop.call_at(due, self._deadline_passed)

    def _deadline_passed(self) -> None:
        self._deadline = None
        due = self._due
        if due is None:
            return
        if self._loop.time() < due - TIMER_SLACK:
            self._deadline = self._loop.call_at(due, self._deadline_passed)
            return
        self._due = None
        if self._unanswered:
            return
        if self._head_started:
            self._refuse(408, f"the request head was not complete within {self._guard.header_timeout:g} s")
        else:
            self.force_close()  # idle: nothing to answer

    def _refuse(self, status: int, reason: str) -> None:
        """Answer before any request exists, then close."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(raw_error(status, reason))
        self.force_close()


class GuardedSite(web.BaseSite):
    """A TCP listener whose connections are ``GuardedHandler``s of one ``ConnectionGuard``."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard) -> None:
        super().__init__(runner, backlog=1024)
        self._host = host
        self._port = port
        self._guard = guard

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        self._server = await loop.create_server(
            lambda: self.protocol(server, loop), self._host, self._port, backlog=self._backlog
        )

    def protocol(self, server: web.Server, loop: asyncio.AbstractEventLoop) -> asyncio.Protocol:
        """Each new connection's protocol (the front door's site starts them on its own)."""
        return self._guard.protocol(server, loop)


def body_reader(config: RouterConfig) -> Callable[[web.Request], Awaitable[web.Response | None]]:
    """What reads each request body whole within ``client_body_timeout_secs``, before the handler runs.

    Handlers then get the body from ``request.read()`` at once. Too slow: 408; too large: 413; framing the
    parser refuses mid-body: 400 — each closes the connection after the bounded lingering read. A body that
    arrived whole with its head (the usual case) is taken without arming a timer.
    """
    timeout = config.client_body_timeout_secs
    limit = config.max_payload_size
    too_large = f"request body exceeds the {limit}-byte limit"

    async def read_body(request: web.Request) -> web.Response | None:
        """None when the body (if any) is read; else the refusal."""
        if (request.content_length or 0) > limit:  # refused on its declared length, before reading any of it
            return json_error(413, too_large, close=True)
        if not request.body_exists:
            return None
        try:
            if request.content.is_eof():
                await request.read()  # all buffered: returns without waiting
            else:
                async with asyncio.timeout(timeout):
                    await request.read()
        except TimeoutError:
            return body_timed_out(timeout)
        except web.HTTPRequestEntityTooLarge:
            return json_error(413, too_large, close=True)
        except RequestPayloadError:
            return json_error(400, BAD_FRAMING, close=True)
        return None

    return read_body


def body_timed_out(timeout: float) -> web.Response:
    """The 408 for a body not complete within ``client_body_timeout_secs`` (the connection ends)."""
    return json_error(408, f"the request body was not complete within {timeout:g} s", close=True)
