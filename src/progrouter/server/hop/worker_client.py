"""The worker hop: HTTP/1.1 requests to workers over kept-alive connections, one asyncio Protocol each.

Every proxied request crosses this hop, and aiohttp's ``ClientSession`` spent several times the CPU of the
same bytes on a kept connection (request building, timeout and trace machinery, the connector, a
body-writer task and response objects per request). Here a request is one buffer written to a pooled
connection and the answer is parsed as it arrives by llhttp (``httptools``, Node's strict HTTP/1.1 parser in
C; it measured half the CPU of a hand-written Python parser per JSON answer and a fifth per SSE chunk): a
``Content-Length``, chunked or read-until-close body. The body is handed on chunk by chunk as it arrives
(SSE), with reading paused while too much of it waits. A connection goes back to its pool only when its
answer was read whole and the worker kept it alive (HTTP/1.1 without ``Connection: close``); idle ones are
closed after ``IDLE_SECONDS``, and at most ``MAX_IDLE`` wait per worker.

Failures, as the proxy classifies them: ``WorkerError`` when the connection is refused, reset or closed
before the answer was whole, or the answer is not valid HTTP/1.1; ``TimeoutError`` when the request's
deadline (``request_timeout_secs``, from the request's start to its answer's last byte) passes. Either
closes the connection, so the worker sees its request abandoned, as it does when the proxy closes an
answer it will not read.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import httptools
from aiohttp import BasicAuth
from aiohttp.http import SERVER_SOFTWARE
from multidict import CIMultiDict
from yarl import URL

MAX_HEAD = 64 * 1024  # bytes of an answer's status line and headers (llhttp itself sets no bound)
HIGH_WATER = 256 * 1024  # body bytes waiting for the consumer at which reading from the worker pauses
# An idle connection is dropped before vLLM's server (uvicorn, 5 s keep-alive) would close it, so a request is
# never written to a connection the worker is closing at that moment.
IDLE_SECONDS = 4.0
# Idle connections kept per worker: enough for a burst's worth of reuse; past it the oldest idle one closes,
# so a burst of thousands of concurrent requests does not leave thousands of sockets open on both ends.
MAX_IDLE = 64
_ONE_BUFFER = 256 * 1024  # request bodies up to this size are written together with the head, as one buffer

# What the connection is doing (one request at a time).
_IDLE, _HEAD, _BODY, _UNTIL_CLOSE, _DONE, _CLOSED = range(6)


class WorkerError(Exception):
    """The worker's connection failed before its answer was whole, or the answer was not HTTP/1.1."""


@dataclass(frozen=True, slots=True, eq=False)
class _Endpoint:
    """Where a worker base URL's requests go: the address to connect to and what each request line says.

    One per base URL (``WorkerClient._endpoints``), so identity is equality: as a key of the idle pool (twice
    a request) it hashes as any object does, not through a generated ``__hash__`` of its fields."""

    host: str
    port: int
    tls: ssl.SSLContext | None
    prefix: str  # the base URL's own path, put before each request's path
    host_header: str
    authorization: str | None  # Basic credentials from the URL's user info (http://user:pass@host)

    @classmethod
    def parse(cls, base_url: str, tls: ssl.SSLContext | None) -> _Endpoint:
        url = URL(base_url)
        if url.scheme not in ("http", "https") or not url.raw_host or url.port is None:
            raise WorkerError(f"{base_url!r} is not an http(s) worker URL")
        host = url.raw_host
        authority = f"[{host}]" if ":" in host else host
        if url.explicit_port is not None and url.port != (443 if url.scheme == "https" else 80):
            authority += f":{url.port}"
        prefix = url.raw_path.rstrip("/")
        credentials = None
        if url.user is not None:
            credentials = BasicAuth(url.user, url.password or "").encode()
        return cls(host, url.port, tls if url.scheme == "https" else None, prefix, authority, credentials)


def _head(method: str, endpoint: _Endpoint, path_qs: str, headers: Mapping[str, str], length: int) -> bytes:
    """The request line and headers, with what aiohttp's client added (Host, Accept, User-Agent,
    Content-Type, Content-Length), refused when a header would hold CR or LF."""
    lines = [f"{name}: {value}\r\n" for name, value in headers.items()]
    if endpoint.authorization is not None and "Authorization" not in headers:
        lines.append(f"Authorization: {endpoint.authorization}\r\n")
    if "Accept" not in headers:
        lines.append("Accept: */*\r\n")
    if "User-Agent" not in headers:
        lines.append(f"User-Agent: {SERVER_SOFTWARE}\r\n")
    if "Content-Type" not in headers:
        lines.append("Content-Type: application/octet-stream\r\n")
    text = (
        f"{method} {endpoint.prefix}{path_qs} HTTP/1.1\r\nHost: {endpoint.host_header}\r\n"
        f"{''.join(lines)}Content-Length: {length}\r\n\r\n"
    )
    if text.count("\n") != len(lines) + 4 or text.count("\r") != len(lines) + 4:
        raise ValueError("a request header holds a CR or LF character")
    return text.encode("utf-8", "surrogateescape")


class WorkerConnection(asyncio.Protocol):
    """One connection to a worker, and the answer being read on it.

    ``WorkerClient.request`` returns it once the answer's head is in (``status``, ``headers``,
    ``content_length``); the caller reads the body (``read`` or ``next_chunk``) and then either
    ``release``s the connection (back to the pool if it may be reused) or ``close``s it.
    """

    def __init__(self, client: WorkerClient, endpoint: _Endpoint) -> None:
        self._client = client
        self.endpoint = endpoint
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._stage = _IDLE
        self._parser = httptools.HttpResponseParser(self)  # one per connection: it resets after each answer
        self._fields: list[tuple[str, str]] = []  # the answer's header fields as they are parsed
        self._head_bytes = 0  # received while the head is not whole, bounded by MAX_HEAD
        self._field_bytes = 0  # of the head's header fields
        self._interim = False  # the head parsed is a 1xx answer's: the final one follows
        self._body: list[bytes] = []  # body bytes the consumer has not taken yet
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._due: float | None = None  # the request's deadline (loop time) while its answer is not whole
        self._timer: asyncio.TimerHandle | None = None
        self.idle_since = 0.0
        self.status = 0
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.content_length: int | None = None
        self.keep_alive = False

    # ------------------------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def data_received(self, data: bytes) -> None:
        if self._stage in (_IDLE, _DONE, _CLOSED):  # nothing was asked: the connection is out of step
            self.keep_alive = False
            if self._stage == _IDLE:
                self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(WorkerError("the worker switched protocols unasked"))
        except httptools.HttpParserError as exc:
            cause = exc.__context__  # a callback's own refusal, re-raised by the parser
            self._fail(
                cause
                if isinstance(cause, WorkerError)
                else WorkerError(f"the worker's answer is not valid HTTP/1.1: {exc}")
            )
            return
        if self._stage == _HEAD:  # no whole head yet: llhttp keeps what it has of it, so bound that
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD:
                self._fail(WorkerError("the head of the worker's answer is too long"))

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost decides what the end means

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._stage == _UNTIL_CLOSE and self._error is None:  # the worker's end is the body's end
            self.keep_alive = False
            self._complete()
        elif self._stage not in (_IDLE, _DONE, _CLOSED):
            reason = "reset" if exc is not None else "closed"
            self._fail(WorkerError(f"connection {reason} by the worker before its answer was whole"))
        if self._stage == _IDLE:
            self._stage = _CLOSED

    def pause_writing(self) -> None:
        """A request body larger than the socket's buffer is left to the transport to write out."""

    def resume_writing(self) -> None:
        """See ``pause_writing``."""

    # ------------------------------------------------------------------------------------- requests
    @property
    def reusable(self) -> bool:
        return self._stage == _IDLE and self._transport is not None and not self._transport.is_closing()

    def send(self, head: bytes, body: bytes, deadline: float) -> None:
        """Write one request; the answer must be whole by ``deadline`` (loop time)."""
        assert self._transport is not None and self._stage == _IDLE
        self._stage = _HEAD
        self._head_bytes = self._field_bytes = 0
        self.content_length = None
        self._due = deadline
        if self._timer is None:  # else one armed for an earlier request's deadline re-arms when it fires
            self._timer = self._loop.call_at(deadline, self._deadline_passed)
        try:
            if len(body) <= _ONE_BUFFER:
                self._transport.write(head + body)
            else:
                self._transport.writelines((head, body))
        except (OSError, RuntimeError) as exc:  # a transport that closed under us
            raise WorkerError(f"the request could not be written: {exc}") from exc

    async def head(self) -> None:
        """Wait for the answer's status line and headers."""
        while self._stage == _HEAD:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def next_chunk(self) -> bytes:
        """The body bytes that arrived since the last call (waiting for some); ``b""`` once it is whole."""
        while not self._body:
            if self._stage == _DONE:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait()
        body = self._body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self._buffered = 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return data

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while chunk := await self.next_chunk():
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """Done with the answer: the connection goes back to the pool if it was read whole and may be
        reused, and is closed otherwise."""
        if self._stage == _DONE and self.keep_alive and self._transport is not None:
            self._stage = _IDLE
            self._client.keep(self)
        else:
            self.close()

    def close(self) -> None:
        """Abandon the connection (and the answer, if it was not read whole): the worker sees it close."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._stage != _DONE:
            self._fail(WorkerError("the connection was closed"))
        self._stage = _CLOSED
        if self._transport is not None:
            self._transport.close()

    # ------------------------------------------------------------------------ parsing (llhttp's callbacks)
    def on_message_begin(self) -> None:
        if self._stage != _HEAD:  # bytes after the answer: the connection is out of step; stop parsing
            self.keep_alive = False
            raise WorkerError("the worker sent more than its answer")
        self._fields = []

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._stage == _HEAD:  # not the trailers (they are not relayed: the answer is already under way)
            self._field_bytes += len(name) + len(value)
            self._fields.append(
                (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
            )

    def on_headers_complete(self) -> None:
        """Status, headers and how the body is framed (RFC 9112 §6.3); 1xx answers are skipped."""
        parser = self._parser
        if self._field_bytes > MAX_HEAD:  # a head that came in one read (longer ones failed as they came)
            raise WorkerError("the head of the worker's answer is too long")
        if parser.get_http_version() not in ("1.1", "1.0"):
            raise WorkerError("the worker's answer is not HTTP/1.1")
        status = parser.get_status_code()
        self._interim = 100 <= status < 200
        if self._interim:
            return  # an interim answer (101 raised HttpParserUpgrade): the final one follows
        headers = CIMultiDict(self._fields)
        self.status = status
        self.headers = headers
        self.keep_alive = parser.should_keep_alive()
        if status in (204, 304):
            self._stage = _BODY  # none: llhttp completes the answer next
            return
        transfer = headers.get("Transfer-Encoding")
        if transfer is not None and transfer.rsplit(",", 1)[-1].strip().lower() != "chunked":
            self._until_close()
        elif transfer is None and "Content-Length" in headers:
            self.content_length = int(headers["Content-Length"])  # llhttp refused a bad or conflicting one
            self._stage = _BODY
        elif transfer is None:
            self._until_close()
        else:
            self._stage = _BODY
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._deliver(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
        elif self._stage != _DONE:
            self._complete()

    def _until_close(self) -> None:
        self.keep_alive = False
        self._stage = _UNTIL_CLOSE

    def _deliver(self, data: bytes) -> None:
        self._body.append(data)
        self._buffered += len(data)
        if self._buffered >= HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def _complete(self) -> None:
        self._stage = _DONE
        self._due = None
        self._wake()

    # -------------------------------------------------------------------------------------- waiting
    async def _wait(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        """The answer cannot be completed: the consumer hears ``error``; the connection closes."""
        if self._stage == _DONE or self._error is not None:
            return
        self._error = error
        self.keep_alive = False
        self._wake()
        if self._transport is not None:
            self._transport.close()

    def _deadline_passed(self) -> None:
        """The timer fired. It is armed once per connection and re-armed lazily: a request on a kept
        connection moves ``_due`` on instead of arming and cancelling a loop timer of its own."""
        self._timer = None
        if self._due is None:  # no answer is being read
            return
        if self._loop.time() < self._due:
            self._timer = self._loop.call_at(self._due, self._deadline_passed)
            return
        self._fail(TimeoutError("the worker's answer was not whole before the request timeout"))


class WorkerClient:
    """Kept-alive connections to the workers, pooled per worker URL (most recently used first)."""

    def __init__(
        self, timeout: float, *, idle_seconds: float = IDLE_SECONDS, max_idle: int = MAX_IDLE
    ) -> None:
        self._timeout = timeout
        self._idle_seconds = idle_seconds
        self._max_idle = max_idle
        self._tls: ssl.SSLContext | None = None
        self._endpoints: dict[str, _Endpoint] = {}
        self._idle: dict[_Endpoint, list[WorkerConnection]] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False
        # The loop, taken at the first request: ``asyncio.get_running_loop`` costs a getpid system call on
        # CPython 3.11, and the hop called it three times per request.
        self._running: asyncio.AbstractEventLoop | None = None

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self._running
        if loop is None or loop.is_closed():
            loop = self._running = asyncio.get_running_loop()
        return loop

    async def request(
        self, method: str, base_url: str, path_qs: str, headers: Mapping[str, str], body: bytes
    ) -> WorkerConnection:
        """Send one request to the worker at ``base_url``; return its connection once the answer's head
        is in. Raises ``WorkerError`` or ``TimeoutError``; the connection is closed then."""
        endpoint = self._endpoints.get(base_url) or self._endpoint(base_url)
        head = _head(method, endpoint, path_qs, headers, len(body))
        deadline = self._loop().time() + self._timeout
        connection = self._take(endpoint) or await self._connect(endpoint, deadline)
        try:
            connection.send(head, body, deadline)
            await connection.head()
        except BaseException:
            connection.close()
            raise
        return connection

    def keep(self, connection: WorkerConnection) -> None:
        """A connection whose answer was read whole, for the next request to its worker."""
        if self._closed:
            connection.close()
            return
        loop = self._loop()
        connection.idle_since = loop.time()
        idle = self._idle.setdefault(connection.endpoint, [])
        if len(idle) >= self._max_idle:
            idle.pop(0).close()  # the oldest idle one: the most recently used are the ones handed out next
        idle.append(connection)
        if self._sweep is None:
            self._sweep = loop.call_later(self._idle_seconds, self._close_idle)

    async def close(self) -> None:
        """Close every idle connection; connections in use close when their answers are done."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()

    def _endpoint(self, base_url: str) -> _Endpoint:
        if base_url.startswith("https:") and self._tls is None:
            self._tls = ssl.create_default_context()
        endpoint = self._endpoints[base_url] = _Endpoint.parse(base_url, self._tls)
        return endpoint

    def _take(self, endpoint: _Endpoint) -> WorkerConnection | None:
        idle = self._idle.get(endpoint)
        if not idle:
            return None
        now = self._loop().time()
        while idle:
            connection = idle.pop()
            if self._fresh(connection, now):
                return connection
            connection.close()
        return None

    def _fresh(self, connection: WorkerConnection, now: float) -> bool:
        return connection.reusable and now - connection.idle_since < self._idle_seconds

    async def _connect(self, endpoint: _Endpoint, deadline: float) -> WorkerConnection:
        loop = self._loop()
        try:
            async with asyncio.timeout_at(deadline):
                _, connection = await loop.create_connection(
                    lambda: WorkerConnection(self, endpoint),
                    endpoint.host,
                    endpoint.port,
                    ssl=endpoint.tls,
                    server_hostname=endpoint.host if endpoint.tls is not None else None,
                )
        except TimeoutError:
            raise
        except OSError as exc:
            raise WorkerError(f"cannot connect to {endpoint.host_header}: {exc}") from exc
        return connection

    def _close_idle(self) -> None:
        """Close the connections idle for ``idle_seconds``; check again while some remain."""
        now = self._loop().time()
        for endpoint, idle in list(self._idle.items()):
            kept = []
            for connection in idle:
                if self._fresh(connection, now):
                    kept.append(connection)
                else:
                    connection.close()
            if kept:
                self._idle[endpoint] = kept
            else:
                del self._idle[endpoint]
        self._sweep = None
        if self._idle:
            self._sweep = self._loop().call_later(self._idle_seconds / 2, self._close_idle)
