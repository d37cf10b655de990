"""The worker hop's client against real loopback servers: an aiohttp worker, and a raw socket server for
answers aiohttp would not write (cut short, read until close, malformed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from progrouter.server.hop.worker_client import HIGH_WATER, MAX_HEAD, WorkerClient, WorkerError
from support.factories import RouterFactory
from support.loopback import serve_app

BODY = b'{"prompt": "hi"}'


class Worker:
    """An aiohttp worker that notes which client connection (its port) carried each request."""

    def __init__(self) -> None:
        self.peers: list[int] = []
        self.heads: list[dict[str, str]] = []
        self.bodies: list[bytes] = []
        self.release = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        self.peers.append(request.transport.get_extra_info("peername")[1])
        self.heads.append(dict(request.headers))
        self.bodies.append(await request.read())
        try:
            return await self._answer(request)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        mode = request.headers.get("X-Mode") or request.match_info["mode"]
        if mode == "length":
            return web.Response(body=b"x" * 100_000, headers={"X-Mode": "length"})
        if mode == "close":
            response = web.Response(body=b"bye")
            response.force_close()
            return response
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "big":  # far more than the client buffers before it pauses reading
            stream = web.StreamResponse()
            await stream.prepare(request)
            for i in range(64):
                await stream.write(bytes([65 + i % 26]) * 32_768)
            await stream.write_eof()
            return stream
        content_type = "application/json" if mode == "chunked-json" else "text/event-stream"
        stream = web.StreamResponse(headers={"Content-Type": content_type})
        stream.enable_chunked_encoding()
        await stream.prepare(request)
        await stream.write(b"data: 1\n\n")
        if mode == "break":
            assert request.transport is not None
            request.transport.close()
            return stream
        await self.release.wait()
        await stream.write(b"data: 2\n\n")
        await stream.write_eof()
        return stream


@pytest.fixture
async def worker() -> AsyncIterator[Worker]:
    w = Worker()
    app = web.Application()
    app.router.add_post("/{mode:.*}", w.handle)
    runner, w.url = await serve_app(app)
    yield w
    w.release.set()
    await runner.cleanup()


@pytest.fixture
async def pool() -> AsyncIterator[WorkerClient]:
    c = WorkerClient(timeout=30)
    yield c
    await c.close()


Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def raw() -> AsyncIterator[Callable[[Answer], Awaitable[tuple[str, list[int]]]]]:
    """A socket server answering each connection with ``answer``; returns its URL and a connection count."""
    servers: list[asyncio.Server] = []

    async def start(answer: Answer) -> tuple[str, list[int]]:
        connections = [0]

        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections[0] += 1
            try:
                await answer(reader, writer)
            finally:
                writer.close()

        server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", connections

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.startswith(b"Content-Length")
    )
    await reader.readexactly(length)


async def test_a_content_length_answer_is_read_whole_and_its_connection_reused(
    worker: Worker, pool: WorkerClient
) -> None:
    for _ in range(3):
        answer = await pool.request("POST", worker.url, "/length?q=1", {"X-Trace": "t"}, BODY)
        assert answer.status == 200 and answer.content_length == 100_000
        assert answer.headers["X-Mode"] == "length"
        assert await answer.read() == b"x" * 100_000
        answer.release()
    assert len(set(worker.peers)) == 1  # three requests, one kept-alive connection
    assert worker.bodies == [BODY] * 3
    head = worker.heads[0]
    assert head["Host"] == worker.url.removeprefix("http://")
    assert head["X-Trace"] == "t" and head["Content-Length"] == str(len(BODY))
    assert head["Accept"] == "*/*" and head["User-Agent"].startswith("Python/")


async def test_a_chunked_stream_is_handed_on_chunk_by_chunk(worker: Worker, pool: WorkerClient) -> None:
    answer = await pool.request("POST", worker.url, "/stream", {}, BODY)
    assert answer.content_length is None
    # The worker holds the rest until `release`: the first chunk can only come on its own.
    assert await answer.next_chunk() == b"data: 1\n\n"
    worker.release.set()
    assert await answer.read() == b"data: 2\n\n"
    assert await answer.next_chunk() == b""
    answer.release()
    again = await pool.request("POST", worker.url, "/length", {}, BODY)
    await again.read()
    again.release()
    assert worker.peers[0] == worker.peers[1]  # a chunked answer read whole leaves the connection reusable


async def test_a_worker_answering_connection_close_is_not_reused(worker: Worker, pool: WorkerClient) -> None:
    for _ in range(2):
        answer = await pool.request("POST", worker.url, "/close", {}, BODY)
        assert not answer.keep_alive
        assert await answer.read() == b"bye"
        answer.release()
    assert worker.peers[0] != worker.peers[1]


async def test_a_stream_broken_midway_raises_and_its_connection_is_not_reused(
    worker: Worker, pool: WorkerClient
) -> None:
    answer = await pool.request("POST", worker.url, "/break", {}, BODY)
    assert await answer.next_chunk() == b"data: 1\n\n"
    with pytest.raises(WorkerError):
        await answer.read()
    answer.close()
    again = await pool.request("POST", worker.url, "/length", {}, BODY)
    await again.read()
    again.release()
    assert worker.peers[0] != worker.peers[1]


async def test_a_content_length_answer_cut_short_raises(
    raw: Callable[..., Awaitable[tuple[str, list[int]]]], pool: WorkerClient
) -> None:
    async def cut_short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")

    url, connections = await raw(cut_short)
    for expected in (1, 2):
        answer = await pool.request("POST", url, "/", {}, BODY)
        assert await answer.next_chunk() == b"abc"
        with pytest.raises(WorkerError, match="before its answer was whole"):
            await answer.next_chunk()
        answer.close()
        assert connections[0] == expected  # the broken connection is never handed out again


async def test_a_connection_closed_before_any_answer_raises(
    raw: Callable[..., Awaitable[tuple[str, list[int]]]], pool: WorkerClient
) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)

    url, _ = await raw(hang_up)
    with pytest.raises(WorkerError):
        await pool.request("POST", url, "/", {}, BODY)


async def test_an_answer_without_length_is_read_until_the_worker_closes(
    raw: Callable[..., Awaitable[tuple[str, list[int]]]], pool: WorkerClient
) -> None:
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nX-A: 1\r\n\r\nfirst ")
        await writer.drain()
        writer.write(b"second")

    url, connections = await raw(until_close)
    for expected in (1, 2):
        answer = await pool.request("POST", url, "/", {}, BODY)
        assert answer.content_length is None and not answer.keep_alive
        assert await answer.read() == b"first second"
        answer.release()
        assert connections[0] == expected


async def test_an_interim_answer_is_skipped_and_chunk_extensions_and_trailers_are_read(
    raw: Callable[..., Awaitable[tuple[str, list[int]]]], pool: WorkerClient
) -> None:
    async def interim(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n"
        )
        await _read_request(reader)  # the connection is kept: a second request follows on it

    url, _ = await raw(interim)
    answer = await pool.request("POST", url, "/", {}, BODY)
    assert answer.status == 201
    assert await answer.read() == b"hello"
    answer.release()
    assert answer.reusable


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/2.0 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Nul: a\0b\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * (MAX_HEAD + 1) + b"\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Split: a\nInjected: b\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY",
    ],
)
async def test_a_malformed_answer_raises(
    answer: bytes, raw: Callable[..., Awaitable[tuple[str, list[int]]]], pool: WorkerClient
) -> None:
    async def malformed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(answer)
        await reader.read()  # hold the connection: the client must end it

    url, _ = await raw(malformed)
    with pytest.raises(WorkerError):
        connection = await pool.request("POST", url, "/", {}, BODY)
        try:
            await connection.read()
        finally:
            connection.close()


async def test_the_request_timeout_bounds_the_head_and_the_body(worker: Worker) -> None:
    pool = WorkerClient(timeout=0.3)
    try:
        with pytest.raises(TimeoutError):
            await pool.request("POST", worker.url, "/hang", {}, BODY)
        await asyncio.wait_for(worker.cancelled.wait(), timeout=10)  # the worker saw the request abandoned
        answer = await pool.request("POST", worker.url, "/stream", {}, BODY)
        assert await answer.next_chunk() == b"data: 1\n\n"
        with pytest.raises(TimeoutError):
            await answer.next_chunk()  # the rest never comes
        answer.close()
    finally:
        await pool.close()


async def test_a_timeout_while_reading_until_close_is_not_taken_for_the_end(
    raw: Callable[..., Awaitable[tuple[str, list[int]]]],
) -> None:
    closed = asyncio.Event()

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\n\r\npartial")
        await reader.read()  # until the client's deadline closes the connection
        closed.set()

    url, _ = await raw(stall)
    pool = WorkerClient(timeout=0.3)
    try:
        answer = await pool.request("POST", url, "/", {}, BODY)
        await asyncio.wait_for(closed.wait(), timeout=10)  # the deadline passed while nobody was reading
        assert await answer.next_chunk() == b"partial"
        with pytest.raises(TimeoutError):
            await answer.next_chunk()  # the close was the deadline's, not the end of the body
        answer.close()
    finally:
        await pool.close()


async def test_an_unreachable_worker_raises(pool: WorkerClient) -> None:
    async def nothing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        return None

    server = await asyncio.start_server(nothing, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(WorkerError, match="cannot connect"):
        await pool.request("POST", f"http://127.0.0.1:{port}", "/", {}, BODY)


async def test_a_header_with_cr_or_lf_is_refused_before_anything_is_sent(
    worker: Worker, pool: WorkerClient
) -> None:
    with pytest.raises(ValueError, match="CR or LF"):
        await pool.request("POST", worker.url, "/length", {"X-A": "1\r\nX-Rank: 3"}, BODY)
    assert worker.bodies == []


async def test_a_connection_idle_too_long_is_not_reused(worker: Worker) -> None:
    pool = WorkerClient(timeout=30, idle_seconds=0)  # every kept connection is already past its idle time
    try:
        for _ in range(2):
            answer = await pool.request("POST", worker.url, "/length", {}, BODY)
            await answer.read()
            answer.release()
    finally:
        await pool.close()
    assert worker.peers[0] != worker.peers[1]


async def test_a_body_larger_than_the_buffer_arrives_whole_and_in_order(
    worker: Worker, pool: WorkerClient
) -> None:
    answer = await pool.request("POST", worker.url, "/big", {}, BODY)
    body = await answer.read()
    answer.release()
    assert 4 * HIGH_WATER < 64 * 32_768
    assert body == b"".join(bytes([65 + i % 26]) * 32_768 for i in range(64))


async def test_the_router_relays_a_chunked_json_answer_and_a_closing_worker(
    worker: Worker, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    router = await make_router([worker.url])
    worker.release.set()
    for _ in range(2):
        headers = {"X-Mode": "chunked-json"}
        async with client.post(router.url + "/v1/completions", data=BODY, headers=headers) as resp:
            assert resp.status == 200
            assert await resp.read() == b"data: 1\n\ndata: 2\n\n"
        async with client.post(
            router.url + "/v1/completions", data=BODY, headers={"X-Mode": "close"}
        ) as resp:
            assert resp.status == 200 and await resp.read() == b"bye"
            assert "Connection" not in resp.headers  # the worker's hop-by-hop header is not relayed
    # A chunked answer read whole leaves its connection for the next request; a closing worker's does not.
    assert worker.peers[0] == worker.peers[1] != worker.peers[2] == worker.peers[3]


async def test_credentials_in_the_worker_url_become_basic_auth_unless_the_request_has_its_own(
    worker: Worker, pool: WorkerClient
) -> None:
    # aiohttp's client did this for `http://user:pass@host` workers, and so does upstream's (reqwest).
    url = worker.url.replace("http://", "http://alice:s%20cret@")
    answer = await pool.request("POST", url, "/length", {}, BODY)
    await answer.read()
    answer.release()
    assert worker.heads[-1]["Authorization"] == aiohttp.BasicAuth("alice", "s cret").encode()
    assert worker.heads[-1]["Host"] == worker.url.removeprefix("http://")
    own = "Bearer client-token"
    answer = await pool.request("POST", url, "/length", {"Authorization": own}, BODY)
    await answer.read()
    answer.release()
    assert worker.heads[-1]["Authorization"] == own
    answer = await pool.request("POST", worker.url, "/length", {}, BODY)
    await answer.read()
    answer.release()
    assert "Authorization" not in worker.heads[-1]


async def test_the_idle_pool_keeps_at_most_max_idle_connections_per_worker() -> None:
    """A burst of 10 concurrent requests opens 10 connections; with ``max_idle=4`` the 6 released past the
    bound are closed (the worker sees them go), and the next burst reuses 4 and opens 6 again."""
    burst, bound = 10, 4
    opened = closed = arrived = 0
    everyone = asyncio.Event()
    gone = asyncio.Event()

    async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal opened, closed, arrived
        opened += 1
        try:
            while True:
                try:
                    await _read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the client closed the connection
                arrived += 1
                if arrived % burst == 0:
                    everyone.set()
                await everyone.wait()  # answer only once the whole burst is in: it needs `burst` connections
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        finally:
            closed += 1
            if closed == burst - bound:
                gone.set()
            writer.close()

    server = await asyncio.start_server(keep_alive, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    pool = WorkerClient(timeout=30, max_idle=bound)

    async def one() -> bytes:
        answer = await pool.request("POST", url, "/", {}, BODY)
        body = await answer.read()
        answer.release()
        return body

    try:
        assert await asyncio.gather(*(one() for _ in range(burst))) == [b"ok"] * burst
        assert opened == burst
        await asyncio.wait_for(gone.wait(), timeout=10)  # the connections past the bound were closed
        assert closed == burst - bound
        everyone.clear()
        assert await asyncio.gather(*(one() for _ in range(burst))) == [b"ok"] * burst
        assert opened == 2 * burst - bound  # the kept ones were reused, the rest opened anew
    finally:
        await pool.close()
        server.close()
        await server.wait_closed()
