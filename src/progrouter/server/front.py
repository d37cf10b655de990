"""The front door: the hot proxied routes served below aiohttp's web layer, everything else by aiohttp.

One listening socket; each connection starts with a ``FrontConnection``. It reads each request head and,
when the request is plain — ``POST`` to a route of ``proxy.PROXIED_ROUTES`` (its path exactly; a query string,
as Claude Code's ``/v1/messages?beta=true``, is forwarded as sent), ``HTTP/1.1``, a
``Content-Length`` body within ``max_payload_size``, no ``Transfer-Encoding``, ``Expect``, ``Upgrade`` or
``Content-Encoding``, and the whole head in the buffer — serves it itself: aiohttp's C parser checks the head
(one HTTP grammar for both servers), the edge's checks run as ``Edge.admit`` (the same function aiohttp's
middleware calls), the proxy as ``proxy_request`` (the same function aiohttp's route handler calls), and the
answer is written straight to the transport: a fixed-length body, or a chunked stream with back-pressure.

Anything else (other routes and methods, chunked or ``Expect: 100-continue`` uploads, HTTP/1.0,
WebSockets, a head split over reads, anything the parser refuses) is handed over, with the bytes already
read, to aiohttp's own protocol (``connection.GuardedHandler``) for the rest of the connection: that is the
rule, "what is not plainly hot goes to the server that handles everything". Hand-over happens only between
requests; requests pipelined in one read are handed over together (aiohttp parses them together and refuses
the lot when one is malformed); a request that arrives while another is answered waits its turn.

What the front door keeps of aiohttp's behaviour: a client that disconnects cancels its request (and so the
worker's); an idle connection closes after ``client_keepalive_timeout_secs``; the body is read within
``client_body_timeout_secs`` (408); the connection bound (503); an answer that ends the connection lingers
over an unread body before closing; and the heads aiohttp writes (``Date``, ``Server``, ``Content-Type``).
"""

from __future__ import annotations

import asyncio
import logging
import re
from http import HTTPStatus

from aiohttp import web
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import HttpRequestParser  # aiohttp's C parser where it is built
from aiohttp.web_request import BaseRequest
from multidict import CIMultiDict, CIMultiDictProxy

from progrouter.config import RouterConfig
from progrouter.server.edge.connection import (
    TIMER_SLACK,
    ConnectionGuard,
    GuardedHandler,
    GuardedSite,
    body_timed_out,
)
from progrouter.server.edge.errors import ANTHROPIC_ROUTES, ERROR_SHAPE, ErrorShape, json_error, raw_error
from progrouter.server.edge.exchange import Answer, Stream
from progrouter.server.edge.middleware import EDGE_KEY, Edge
from progrouter.server.edge.request_id import REQUEST_ID
from progrouter.server.proxy import PROXIED_ROUTES, PROXY_KEY, Proxy, proxy_request

log = logging.getLogger("progrouter.edge")

HOT_TARGETS = frozenset(route.encode() for route in PROXIED_ROUTES)
# A head naming any of these is handed over (matched on the lower-cased head, after a line break).
_HANDED_OVER_FIELDS = re.compile(rb"\n(?:transfer-encoding|expect|upgrade|content-encoding):")
# A bodiless request of these methods is lent to aiohttp alone; the connection comes back after its answer.
_LENT_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"DELETE"})
PIPELINE_BUFFER = 1 << 20  # bytes read ahead of the request being answered before reading pauses
_MAX_LINE, _MAX_FIELD, _MAX_HEADERS = 8190, 8190, 128  # aiohttp's limits, so both servers refuse alike


class FrontDoor:
    """What every front-door connection of one listening socket shares, and the set of them."""

    def __init__(
        self,
        server: web.Server,
        guard: ConnectionGuard,
        edge: Edge,
        proxy: Proxy,
        *,
        max_payload: int,
        body_timeout: float,
    ) -> None:
        self.server = server  # aiohttp's, for hand-overs
        self.guard = guard
        self.edge = edge
        self.proxy = proxy
        self.max_payload = max_payload
        self.body_timeout = body_timeout
        self.connections: set[FrontConnection] = set()
        self.closing = False
        # Requests answered here, bodiless ones lent to aiohttp, connections handed over for good.
        self.served = self.lent = self.handed_over = 0

    def protocol(self, loop: asyncio.AbstractEventLoop) -> FrontConnection:
        return FrontConnection(self, loop)

    async def shutdown(self, timeout: float) -> None:
        """Close idle connections now; give requests in progress ``timeout`` seconds, then cut them off."""
        self.closing = True
        tasks = []
        for connection in list(self.connections):
            task = connection.close_when_idle()
            if task is not None:
                tasks.append(task)
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                task.cancel()
        for connection in list(self.connections):
            connection.close()


class FrontRequest:
    """One request the front door serves: what the edge (``exchange.Inbound``) and the proxy
    (``exchange.Exchange``) read of it."""

    __slots__ = (
        "_connection",
        "body",
        "body_exists",
        "headers",
        "keep_alive",
        "method",
        "missing",
        "parts",
        "path",
        "path_qs",
        "raw_headers",
        "streaming",
        "waiter",
    )

    def __init__(self, connection: FrontConnection, message: object, length: int) -> None:
        self._connection = connection
        self.method: str = message.method  # type: ignore[attr-defined]
        self.path_qs: str = message.path  # type: ignore[attr-defined]  # the request target as sent
        self.path = self.path_qs.partition("?")[0]
        self.headers: CIMultiDictProxy[str] = message.headers  # type: ignore[attr-defined]
        self.raw_headers: tuple[tuple[bytes, bytes], ...] = message.raw_headers  # type: ignore[attr-defined]
        self.keep_alive = not message.should_close  # type: ignore[attr-defined]
        self.body_exists = length > 0
        self.body = b""
        self.missing = length  # body bytes not yet read
        self.parts: list[bytes] = []
        self.waiter: asyncio.Future[None] | None = None  # while the route waits for the body
        self.streaming = False  # a stream's head is out: no other answer may follow

    async def stream(self, status: int, headers: CIMultiDict[str]) -> Stream:
        return self._connection.start_stream(self, status, headers)

    def abort(self) -> None:
        self._connection.close()


class FrontStream:
    """A chunked answer under way on a front-door connection."""

    __slots__ = ("_connection", "_empty", "prepared", "status")

    def __init__(self, connection: FrontConnection, status: int, empty: bool) -> None:
        self._connection = connection
        self.status = status
        self.prepared = True
        self._empty = empty  # a status that has no body (1xx, 204, 304): nothing is framed

    async def write(self, data: bytes) -> None:
        if data and not self._empty:
            await self._connection.send(b"%x\r\n%b\r\n" % (len(data), data))

    async def write_eof(self, data: bytes = b"") -> None:
        await self.write(data)
        if not self._empty:
            await self._connection.send(b"0\r\n\r\n")


def _head(status: int, reason: str | None, headers: CIMultiDict[str]) -> bytes:
    phrase = reason if reason is not None else HTTPStatus(status).phrase
    lines = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])  # a list: join's fast path
    return f"HTTP/1.1 {status} {phrase}\r\n{lines}\r\n".encode("latin-1")


def _empty_body(status: int) -> bool:
    return status < 200 or status in (204, 304)


def _content_length(request_headers: CIMultiDictProxy[str]) -> int | None:
    """The declared body length (0 when none); None when it is not one plain decimal number."""
    values = request_headers.getall("Content-Length", ())
    if not values:
        return 0
    if len(values) != 1 or not (values[0].isascii() and values[0].isdigit()):
        return None
    return int(values[0])


class FrontConnection(asyncio.Protocol):
    """One client connection on the front door, until it is handed over to aiohttp or closed."""

    def __init__(self, door: FrontDoor, loop: asyncio.AbstractEventLoop) -> None:
        self._door = door
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._request: FrontRequest | None = None  # the request being answered
        self._parser: HttpRequestParser | None = None  # made for the first head served here
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None  # armed at or before ``_idle_due``
        self._idle_due: float | None = None  # loop time the idle connection closes (None: not idle)
        self._read_paused = False
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._lingering = False  # dropping the rest of a body answered before it was in
        self._linger_keeps = False
        self._linger_timer: asyncio.TimerHandle | None = None
        self._closed = False

    # -------------------------------------------------------------------------------- transport events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        refusal = self._door.guard.admit()
        if refusal is not None:
            transport.write(raw_error(503, refusal))  # type: ignore[attr-defined]
            transport.close()
            self._closed = True
            return
        self._door.connections.add(self)
        self._wait_idle()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._closed = True
        self._forget()
        if self._task is not None:
            self._task.cancel()  # as aiohttp's handler_cancellation: the worker's request is abandoned too
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ConnectionResetError("the client closed the connection"))

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        request = self._request
        if self._lingering and request is not None:
            self._dropped(request, data)
            return
        if request is not None and request.missing and not self._buffer:
            # The body straight from the read (an agent's is hundreds of kB): not copied through the buffer.
            missing = request.missing
            if len(data) > missing:
                self._buffer += data[missing:]  # the next request, pipelined
                data = data[:missing]
            self._add_part(request, data)
            return
        self._buffer += data
        if request is None:
            self._next_request(one_read=True)
        elif request.missing:
            self._take_body(request)
        elif len(self._buffer) > PIPELINE_BUFFER and not self._read_paused:
            self._read_paused = True
            self._transport.pause_reading()  # type: ignore[union-attr]

    def eof_received(self) -> bool | None:
        return None  # the transport closes; a request in progress is cancelled as the connection is lost

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # -------------------------------------------------------------------------------------- requests
    def _next_request(self, *, one_read: bool = False) -> None:
        """Start answering the request at the head of the buffer, or hand the connection over (``one_read``:
        the buffer is what one read brought)."""
        buffer = self._buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            self._hand_over()  # a head split over reads (or not HTTP/1.1 framing): aiohttp's deadlines
            return
        end += 4
        line = bytes(buffer[: buffer.find(b"\r\n")]).split(b" ")
        head = bytes(buffer[:end])
        lowered = head.lower()
        plain = len(line) == 3 and line[2] == b"HTTP/1.1"
        plain = plain and _HANDED_OVER_FIELDS.search(lowered) is None
        if not plain or line[0] != b"POST" or line[1].partition(b"?")[0] not in HOT_TARGETS:
            if (
                plain
                and line[0] in _LENT_METHODS
                and b"\ncontent-length:" not in lowered
                and not (one_read and len(buffer) > end)
            ):
                self._lend(end)
            else:
                self._hand_over()
            return
        if self._parser is None:
            self._parser = HttpRequestParser(
                None,  # no protocol: the parser is given the head alone, never a body to stream
                self._loop,
                1 << 16,
                max_line_size=_MAX_LINE,
                max_field_size=_MAX_FIELD,
                max_headers=_MAX_HEADERS,
                # The message ends with its head: no body stream is built for it (a StreamReader per request
                # the front door would not use), as the front door reads the body itself.
                response_with_body=False,
                auto_decompress=False,
            )
        try:
            # One parser per connection: after a whole head it waits for the next one. A head it refuses
            # hands the connection over, so a parser in its error state is never fed again.
            messages, upgraded, _tail = self._parser.feed_data(head)
        except HttpProcessingError:
            self._hand_over()  # aiohttp answers it in the JSON error shape
            return
        if len(messages) != 1 or upgraded:
            self._hand_over()
            return
        message = messages[0][0]
        length = _content_length(message.headers)
        if length is None or length > self._door.max_payload or (one_read and len(buffer) > end + length):
            # aiohttp refuses a bad or oversize length (after the access check, as for any request); and it
            # takes requests pipelined in one read together, refusing them all when one is malformed.
            self._hand_over()
            return
        del buffer[:end]
        self._door.served += 1
        request = self._request = FrontRequest(self, message, length)
        self._idle_due = None  # busy: the idle timer, when it fires, finds no deadline
        if length:
            self._take_body(request)
        self._task = self._loop.create_task(self._serve(request))

    def _take_body(self, request: FrontRequest) -> None:
        buffer = self._buffer
        with memoryview(buffer) as view:  # one copy (a bytearray slice would be a second)
            part = bytes(view[: request.missing])
        del buffer[: len(part)]
        self._add_part(request, part)

    @staticmethod
    def _add_part(request: FrontRequest, part: bytes) -> None:
        if part:
            request.parts.append(part)
            request.missing -= len(part)
        if not request.missing:
            request.body = part if len(request.parts) == 1 else b"".join(request.parts)
            request.parts.clear()
            if request.waiter is not None and not request.waiter.done():
                request.waiter.set_result(None)

    async def _read_body(self, request: FrontRequest) -> web.Response | None:
        """None once the body is in; the 408 when it is not within the body deadline."""
        if not request.missing:
            return None
        request.waiter = self._loop.create_future()
        try:
            async with asyncio.timeout(self._door.body_timeout):
                await request.waiter
        except TimeoutError:
            return body_timed_out(self._door.body_timeout)
        return None

    async def _serve(self, request: FrontRequest) -> None:
        door = self._door
        edge = door.edge
        rid = edge.request_id(request)
        REQUEST_ID.set(rid)  # this task's own context
        if request.path in ANTHROPIC_ROUTES:
            ERROR_SHAPE.set(ErrorShape.ANTHROPIC)
        keep_alive = request.keep_alive

        async def route(headers: CIMultiDict[str] | None) -> Answer:
            if headers is not None:
                request.headers = CIMultiDictProxy(headers)
            return await proxy_request(request, edge.state, door.proxy)

        try:
            answer = await edge.admit(request, lambda: self._read_body(request), route)
            if request.streaming:
                keep_alive = keep_alive and answer is not None and not isinstance(answer, web.StreamResponse)
            # The usual answer's exact type first: isinstance against StreamResponse (an ABC) is slow.
            elif type(answer) is web.Response or isinstance(answer, web.StreamResponse):
                keep_alive = keep_alive and answer.keep_alive is not False
                await self._send_response(request, answer, rid, keep_alive)
        except asyncio.CancelledError:
            raise
        except ConnectionError:
            keep_alive = False
        except Exception:  # nothing a request does may take the server down
            log.exception("unexpected error while answering %s", request.path)
            keep_alive = False
            if self._request is request and not self._closed and not request.streaming:
                error = json_error(500, "internal router error", close=True)
                await self._send_response(request, error, rid, False)
        self._finished(request, keep_alive)

    async def _send_response(
        self, request: FrontRequest, response: web.StreamResponse, rid: str, keep_alive: bool
    ) -> None:
        """A response not yet sent, written whole (an unprepared StreamResponse has no body)."""
        status = response.status
        body = response.body if isinstance(response, web.Response) else b""
        if not isinstance(body, bytes):
            raise TypeError("the front door writes byte bodies only")
        headers = response.headers
        self._door.edge.decorate(headers, request.headers, rid)
        empty = _empty_body(status)
        if empty:
            headers.popall("Content-Length", None)
            body = b""
        else:
            headers["Content-Length"] = str(len(body))
            if body:
                headers.setdefault("Content-Type", "application/octet-stream")
        self._common(headers, keep_alive)
        await self.send(_head(status, response.reason, headers) + body)

    def start_stream(self, request: FrontRequest, status: int, headers: CIMultiDict[str]) -> FrontStream:
        """Write the head of a chunked answer (the proxy writes the chunks)."""
        if self._closed:
            raise ConnectionResetError("the client closed the connection")
        self._door.edge.decorate(headers, request.headers, REQUEST_ID.get())
        empty = _empty_body(status)
        if not empty:
            headers["Transfer-Encoding"] = "chunked"
            headers.setdefault("Content-Type", "application/octet-stream")
        self._common(headers, request.keep_alive)
        request.streaming = True
        self._transport.write(_head(status, None, headers))  # type: ignore[union-attr]
        return FrontStream(self, status, empty)

    @staticmethod
    def _common(headers: CIMultiDict[str], keep_alive: bool) -> None:
        """What aiohttp adds to every head."""
        headers.setdefault("Date", rfc822_formatted_time())
        headers.setdefault("Server", SERVER_SOFTWARE)
        if not keep_alive:
            headers["Connection"] = "close"

    async def send(self, data: bytes) -> None:
        """Write ``data``; wait while the client reads slower than the answer comes (back-pressure)."""
        transport = self._transport
        if self._closed or transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        transport.write(data)
        if self._write_paused:
            self._drained = self._loop.create_future()
            await self._drained

    def _finished(self, request: FrontRequest, keep_alive: bool) -> None:
        """The answer is out: the next request, the idle wait, or the end of the connection."""
        if self._request is not request:
            return
        self._task = None
        if self._closed:  # cut off (a broken stream, a stop): nothing follows
            self._request = None
            return
        keep_alive = keep_alive and not self._door.closing
        if request.missing:  # answered before its body was in (a refusal): the rest is dropped first
            self._linger(keep_alive)
            return
        self._request = None
        if keep_alive:
            self._go_on(one_read=False)
        else:
            self.close()

    def _go_on(self, *, one_read: bool) -> None:
        if self._read_paused:
            self._read_paused = False
            self._transport.resume_reading()  # type: ignore[union-attr]
        if self._buffer:
            self._next_request(one_read=one_read)
        else:
            self._wait_idle()

    def _linger(self, keep_alive: bool) -> None:
        """Read and drop the rest of a body answered before it was in, for up to ``lingering_time`` (aiohttp's
        lingering read: the client can read the answer); then go on with the connection if it is kept."""
        self._lingering = True
        self._linger_keeps = keep_alive
        self._linger_timer = self._loop.call_later(self._door.guard.lingering_time, self.close)

    def _dropped(self, request: FrontRequest, data: bytes) -> None:
        """``data`` read while lingering over ``request``'s unread body."""
        take = min(len(data), request.missing)
        request.missing -= take
        if request.missing:
            return
        self._lingering = False
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        self._request = None
        if not self._linger_keeps:
            self.close()
            return
        self._buffer += data[take:]
        self._go_on(one_read=True)

    def _wait_idle(self) -> None:
        """Close after ``client_keepalive_timeout_secs`` without a request. Lazily, as the connection guard's
        deadline: a timer already armed no later stays and re-arms when it finds the deadline moved on, so a
        busy keep-alive connection has one timer per idle period, not one armed and cancelled per request."""
        due = self._idle_due = self._loop.time() + self._door.guard.keepalive_timeout
        if self._idle is None or self._idle.when() > due:
            if self._idle is not None:
                self._idle.cancel()
            self._idle = self._loop.call_at(due, self._idle_passed)

    def _idle_passed(self) -> None:
        self._idle = None
        due = self._idle_due
        if due is None:  # a request is being answered: the next idle period arms its own timer
            return
        if self._loop.time() < due - TIMER_SLACK:
            self._idle = self._loop.call_at(due, self._idle_passed)
            return
        self.close()

    def close_when_idle(self) -> asyncio.Task[None] | None:
        """Shutdown: close now if no request is in progress, else return its task."""
        if self._task is None:
            self.close()
        return self._task

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._forget()
        if self._transport is not None:
            self._transport.close()

    def _forget(self) -> None:
        if self in self._door.connections:
            self._door.connections.discard(self)
            self._door.guard.release()
        self._idle_due = None
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _hand_over(self) -> None:
        """aiohttp's protocol takes the connection from here, with the bytes read so far."""
        data = bytes(self._buffer)
        self._buffer.clear()
        self._door.handed_over += 1
        self._to_aiohttp(data, None)

    def _lend(self, end: int) -> None:
        """aiohttp's protocol answers the bodiless request of the buffer's first ``end`` bytes; what the
        client sends meanwhile waits here, and the connection comes back with the answer (``LentHandler``)."""
        head = bytes(self._buffer[:end])
        del self._buffer[:end]
        self._door.lent += 1
        self._to_aiohttp(head, self)

    def _to_aiohttp(self, data: bytes, lender: FrontConnection | None) -> None:
        transport = self._transport
        assert transport is not None
        self._closed = True
        self._forget()
        door = self._door
        handler = door.guard.protocol(door.server, self._loop, None if lender is None else LentHandler)
        if isinstance(handler, LentHandler):
            handler.lender = lender
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if self._read_paused and lender is None:
            self._read_paused = False
            transport.resume_reading()
        handler.data_received(data)

    def take_back(self, transport: asyncio.Transport) -> None:
        """The lent request is answered: this protocol has the connection again."""
        refusal = self._door.guard.admit()  # the aiohttp protocol released its count just now
        assert refusal is None
        self._transport = transport
        self._closed = False
        transport.set_protocol(self)
        self._door.connections.add(self)
        if self._read_paused and len(self._buffer) <= PIPELINE_BUFFER:
            self._read_paused = False
            transport.resume_reading()
        if self._door.closing:
            self.close()
        elif self._buffer:
            self._next_request()
        else:
            self._wait_idle()

    def stash(self, data: bytes) -> None:
        """What the client sends while aiohttp answers a lent request."""
        self._buffer += data
        if len(self._buffer) > PIPELINE_BUFFER and not self._read_paused and self._transport is not None:
            self._read_paused = True
            self._transport.pause_reading()


class LentHandler(GuardedHandler):
    """aiohttp's protocol for one request the front door lends it (``FrontConnection._lend``)."""

    lender: FrontConnection | None = None

    def data_received(self, data: bytes) -> None:
        if self._request_count == 0 or self.lender is None:  # the lent request itself (or no lender left)
            super().data_received(data)
        else:
            self.lender.stash(data)

    async def finish_response(
        self, request: BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        answered = await super().finish_response(request, resp, start_time)
        if resp.keep_alive and self.lender is not None:
            asyncio.get_running_loop().call_soon(self._give_back)  # once aiohttp waits for the next request
        return answered

    def _give_back(self) -> None:
        transport, lender = self.transport, self.lender
        if transport is None or lender is None or transport.is_closing() or self._force_close or self._close:
            return
        self.lender = None
        self.transport = None  # aiohttp lets go of the connection without closing it
        self.connection_lost(None)
        lender.take_back(transport)


class FrontSite(GuardedSite):
    """The router's listener with the front door: every connection starts on it."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        guard: ConnectionGuard,
        config: RouterConfig,
        *,
        grace: float,
    ) -> None:
        super().__init__(runner, host, port, guard)
        server = runner.server
        assert server is not None  # the runner is set up
        app = runner.app
        self._grace = grace
        self._door = FrontDoor(
            server,
            guard,
            app[EDGE_KEY],
            app[PROXY_KEY],
            max_payload=config.max_payload_size,
            body_timeout=config.client_body_timeout_secs,
        )

    @property
    def door(self) -> FrontDoor:
        return self._door

    def protocol(self, server: web.Server, loop: asyncio.AbstractEventLoop) -> asyncio.Protocol:
        return self._door.protocol(loop)

    async def stop(self) -> None:
        await super().stop()
        await self._door.shutdown(self._grace)
