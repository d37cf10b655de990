"""The front door over real loopback sockets: which requests it serves, what it hands to aiohttp, and the
HTTP/1.1 details both servers must get right (keep-alive, pipelining, uploads, errors, hang-ups)."""

from __future__ import annotations

import argparse
import asyncio
import threading
from typing import Any

import orjson
import pytest
import uvloop
from aiohttp import web

from progrouter.config import RouterConfig
from progrouter.server.cli import add_arguments, config_from_args
from progrouter.server.front import FrontDoor
from progrouter.server.runner import RunningRouter, start_router
from support.factories import RouterFactory, router_config
from support.loopback import serve_app

from .conftest import WorkerFactory
from .workers import FakeWorker

CHAT = "/v1/chat/completions"
BODY = orjson.dumps({"model": "model-a", "messages": [{"role": "user", "content": "hi"}]})


def post(body: bytes = BODY, path: str = CHAT, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: router\r\n\r\n".encode()


class Conn:
    """A raw client connection that reads replies one at a time (fixed-length or chunked)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, router: RunningRouter) -> Conn:
        host, port = router.url.removeprefix("http://").rsplit(":", 1)
        return cls(*await asyncio.open_connection(host, int(port)))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def head(self) -> tuple[int, dict[str, str]]:
        raw = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        lines = raw.decode("latin-1").split("\r\n")
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
        }
        return int(lines[0].split(" ", 2)[1]), headers

    async def reply(self) -> tuple[int, dict[str, str], bytes]:
        status, headers = await self.head()
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while size := int((await self.reader.readuntil(b"\r\n")).strip(), 16):
                body += await self.reader.readexactly(size)
                await self.reader.readexactly(2)
            await self.reader.readexactly(2)
            return status, headers, body
        return status, headers, await self.reader.readexactly(int(headers.get("content-length", "0")))

    async def closed(self) -> bool:
        """The server closed the connection (EOF within a bounded wait)."""
        return await asyncio.wait_for(self.reader.read(), 10) == b""

    def close(self) -> None:
        self.writer.close()

    async def __aenter__(self) -> Conn:
        return self

    async def __aexit__(self, *_: object) -> None:
        self.close()


def door(router: RunningRouter) -> FrontDoor:
    front = router.front_door
    assert front is not None
    return front


Served = tuple[FakeWorker, RunningRouter]


@pytest.fixture
async def served(make_worker: WorkerFactory, make_router: RouterFactory) -> Served:
    """One worker behind a router with the front door on (the default)."""
    worker = await make_worker()
    return worker, await make_router([worker.url])


async def test_hot_requests_are_served_here_and_a_bodiless_get_is_lent_on_the_same_connection(
    served: Served,
) -> None:
    worker, router = served
    async with await Conn.open(router) as conn:
        for request, expected in ((post(), 200), (get("/health"), 200), (post(), 200), (get("/nope"), 404)):
            await conn.send(request)
            status, headers, body = await conn.reply()
            assert status == expected, body
            assert headers["x-request-id"]
            assert "date" in headers and headers["server"].startswith("Python/")
        assert door(router).served == 2 and door(router).lent == 2 and door(router).handed_over == 0
        assert [r["raw"] for r in worker.requests] == [BODY, BODY]
        assert worker.requests[0]["headers"]["X-Request-ID"].startswith("chatcmpl-")


async def test_requests_pipelined_in_one_read_go_to_aiohttp_together_and_are_answered_in_order(
    served: Served,
) -> None:
    _, router = served
    async with await Conn.open(router) as conn:
        bad = b'{"model": '
        await conn.send(post() + get("/liveness") + post(bad) + post(path="/v1/completions"))
        replies = [await conn.reply() for _ in range(4)]
        assert [r[0] for r in replies] == [200, 200, 400, 200]
        assert b"malformed JSON body" in replies[2][2]
        assert orjson.loads(replies[3][2])["path"] == "/v1/completions"
        assert door(router).handed_over == 1 and door(router).served == 0


async def test_requests_sent_while_one_is_answered_wait_their_turn(served: Served) -> None:
    worker, router = served
    async with await Conn.open(router) as conn:
        await conn.send(post(orjson.dumps({"model": "model-a", "test_mode": "sse", "stream": True})))
        await asyncio.wait_for(worker.received.wait(), 10)
        await conn.send(post(path="/v1/completions"))
        await conn.send(get("/liveness"))
        await conn.send(post(b'{"model": '))
        worker.release.set()
        replies = [await conn.reply() for _ in range(4)]
        assert [r[0] for r in replies] == [200, 200, 200, 400]
        assert replies[0][2].endswith(b"data: [DONE]\n\n")
        assert orjson.loads(replies[1][2])["path"] == "/v1/completions"
        assert b"malformed JSON body" in replies[3][2]
        assert (door(router).served, door(router).lent, door(router).handed_over) == (3, 1, 0)


async def test_chunked_and_expect_continue_uploads_go_to_aiohttp_and_are_forwarded_whole(
    served: Served,
) -> None:
    worker, router = served
    async with await Conn.open(router) as conn:
        half = len(BODY) // 2
        chunks = f"{half:x}\r\n".encode() + BODY[:half] + f"\r\n{len(BODY) - half:x}\r\n".encode()
        chunks += BODY[half:] + b"\r\n0\r\n\r\n"
        head = f"POST {CHAT} HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        await conn.send(head + chunks)
        status, _headers, _body = await conn.reply()
        assert status == 200
        assert worker.requests[-1]["raw"] == BODY
        assert door(router).handed_over == 1 and door(router).served == 0
    async with await Conn.open(router) as conn:
        await conn.send(post(extra="Expect: 100-continue\r\n")[: -len(BODY)])
        status, _headers = await conn.head()
        assert status == 100
        await conn.send(BODY)
        status, _headers, _body = await conn.reply()
        assert status == 200 and worker.requests[-1]["raw"] == BODY


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost r\r\nContent-Length: 2\r\n\r\n{}", 400),
        (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400),
        (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: -2\r\n\r\n{}", 400),
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 100000\r\n\r\n{}", 413),
        (b"POST /v1/chat/completions HTTP/1.1\r\nX: a\x00b\r\nContent-Length: 2\r\n\r\n{}", 400),
    ],
)
async def test_bad_heads_and_oversize_bodies_get_the_json_error_and_reach_no_worker(
    make_worker: WorkerFactory, make_router: RouterFactory, request_bytes: bytes, status: int
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], max_payload_size=65536)
    async with await Conn.open(router) as conn:
        await conn.send(request_bytes)
        got, headers, body = await conn.reply()
        assert got == status, body
        assert headers["content-type"].startswith("application/json")
        assert orjson.loads(body)["error"]["code"] == status
        assert worker.requests == []


async def test_heads_after_served_ones_are_parsed_afresh_and_a_bad_one_still_goes_to_aiohttp(
    served: Served,
) -> None:
    """The connection's parser is kept from head to head: what it read before changes nothing."""
    worker, router = served
    other = orjson.dumps({"model": "model-b"})
    async with await Conn.open(router) as conn:
        for body, extra in ((BODY, "X-A: 1\r\n"), (other, ""), (BODY, "Content-Length: 3\r\n")):
            await conn.send(post(body, extra=extra))
            status, _headers, reply = await conn.reply()
            if extra.startswith("Content-Length"):  # a second, differing length: the parser refuses it
                assert status == 400 and orjson.loads(reply)["error"]["code"] == 400
            else:
                assert status == 200, reply
        assert door(router).served == 2 and door(router).handed_over == 1
        assert [r["raw"] for r in worker.requests] == [BODY, other]
        assert worker.requests[0]["headers"].get("X-A") == "1" and "X-A" not in worker.requests[1]["headers"]


async def test_a_body_sent_after_its_head_is_waited_for_and_one_that_never_ends_gets_408(
    make_worker: WorkerFactory, make_router: RouterFactory
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], client_body_timeout_secs=0.5)
    async with await Conn.open(router) as conn:
        request = post()
        await conn.send(request[:-5])
        await asyncio.sleep(0.05)  # the rest comes in a later read; no timing is asserted
        await conn.send(request[-5:])
        status, _headers, _body = await conn.reply()
        assert status == 200 and worker.requests[-1]["raw"] == BODY
        assert door(router).served == 1
        await conn.send(request[:-5])
        status, headers, body = await conn.reply()
        assert status == 408 and headers["connection"] == "close"
        assert b"not complete within 0.5 s" in body
        assert await conn.closed()
        assert len(worker.requests) == 1


async def test_a_body_read_in_parts_is_taken_whole_and_the_request_behind_it_comes_next(
    served: Served,
) -> None:
    """A large body arrives over several reads, the last of which also holds the next request: each body
    reaches the worker whole, and the next request is answered after the first."""
    worker, router = served
    first = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 300_000}]})
    second = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "second"}]})
    request = post(first)
    async with await Conn.open(router) as conn:
        await conn.send(request[:100_000])
        await asyncio.sleep(0.05)  # separate reads; no timing is asserted
        await conn.send(request[100_000:200_000])
        await asyncio.sleep(0.05)
        await conn.send(request[200_000:] + post(second))
        assert (await conn.reply())[0] == 200
        assert (await conn.reply())[0] == 200
    assert [r["raw"] for r in worker.requests] == [first, second]
    assert door(router).served == 2


async def test_a_client_that_hangs_up_mid_stream_cancels_the_worker_request(served: Served) -> None:
    worker, router = served
    conn = await Conn.open(router)
    await conn.send(post(orjson.dumps({"model": "model-a", "test_mode": "sse", "stream": True})))
    status, headers = await conn.head()
    assert status == 200 and headers["transfer-encoding"] == "chunked"
    assert headers["content-type"] == "text/event-stream" and headers["x-worker"] == worker.name
    first = await asyncio.wait_for(conn.reader.readuntil(b"\n\n\r\n"), 10)
    assert b'data: {"n": 1}' in first
    conn.close()
    await asyncio.wait_for(worker.cancelled.wait(), 10)
    async with asyncio.timeout(10):
        while router.state.active_requests:
            await asyncio.sleep(0.01)


async def test_a_stream_is_relayed_whole_in_chunks_and_the_connection_is_kept(served: Served) -> None:
    worker, router = served
    async with await Conn.open(router) as conn:
        worker.release.set()
        await conn.send(post(orjson.dumps({"model": "model-a", "test_mode": "sse", "stream": True})))
        status, _headers, body = await conn.reply()
        assert status == 200
        assert body == b'data: {"n": 1}\n\ndata: {"n": 2}\n\ndata: [DONE]\n\n'
        await conn.send(post())
        assert (await conn.reply())[0] == 200
        assert door(router).served == 2


async def test_program_requests_through_the_front_door_release_their_capacity(
    make_worker: WorkerFactory, make_router: RouterFactory
) -> None:
    """Answered Program requests and one whose client hangs up mid-stream all give their capacity back."""
    worker = await make_worker()
    router = await make_router([worker.url], {"token_capacity_per_dp_rank": 100000})
    context = orjson.dumps({"task_id": "t1", "agent_id": "a"}).decode()
    fields: dict[str, Any] = {"model": "model-a", "prompt": "hi", "vllm_xargs": {"agentic_context": context}}
    async with await Conn.open(router) as conn:
        for _ in range(3):
            await conn.send(post(orjson.dumps(fields), "/v1/completions"))
            assert (await conn.reply())[0] == 200
        assert await _in_flight(conn) == 0
        streamed = await Conn.open(router)
        await streamed.send(
            post(orjson.dumps({**fields, "test_mode": "sse", "stream": True}), "/v1/completions")
        )
        assert (await streamed.head())[0] == 200
        assert await _in_flight(conn) == 1
        streamed.close()
        await asyncio.wait_for(worker.cancelled.wait(), 10)
        async with asyncio.timeout(10):
            while await _in_flight(conn):
                await asyncio.sleep(0.02)
        assert door(router).served == 4


async def _in_flight(conn: Conn) -> int:
    """Requests the scheduler counts in flight, asked on ``conn`` (an admin route: lent to aiohttp)."""
    await conn.send(get("/scheduling/diagnostics"))
    status, _headers, raw = await conn.reply()
    assert status == 200
    diagnostics: Any = orjson.loads(raw)
    return sum(int(rank["router_in_flight_requests"]) for rank in diagnostics["ranks"])


async def test_stop_closes_idle_front_connections(make_worker: WorkerFactory) -> None:
    worker = await make_worker()
    router = await start_router(router_config([worker.url]))
    async with await Conn.open(router) as conn:
        await conn.send(post())
        assert (await conn.reply())[0] == 200
        await router.stop()
        assert await conn.closed()
        await router.stop()


async def test_an_idle_connection_closes_a_keep_alive_timeout_after_its_last_answer(
    make_worker: WorkerFactory,
) -> None:
    """The idle deadline starts again with every answer: a connection busy for longer than the timeout
    stays open, and closes once it has been idle for the timeout."""
    worker = await make_worker()
    router = await start_router(router_config([worker.url], client_keepalive_timeout_secs=0.4))
    loop = asyncio.get_running_loop()
    try:
        async with await Conn.open(router) as conn:
            for _ in range(5):  # 0.75 s in all, never 0.4 s idle
                await conn.send(post())
                assert (await conn.reply())[0] == 200
                answered = loop.time()
                await asyncio.sleep(0.15)
            assert await conn.closed()
            assert loop.time() - answered >= 0.4 - 0.01
    finally:
        await router.stop()


async def _keep_alive_scenario() -> tuple[list[int], int, int]:
    worker = await FakeWorker("uv").start()
    router = await start_router(RouterConfig(worker_urls=[worker.url], host="127.0.0.1", port=0))
    try:
        conn = await Conn.open(router)
        statuses = []
        for request in (post(), get("/health"), post()):
            await conn.send(request)
            statuses.append((await conn.reply())[0])
        conn.close()
        return statuses, door(router).served, door(router).lent
    finally:
        await router.stop()
        await worker.stop()


def test_under_uvloop_the_connection_goes_to_aiohttp_and_comes_back() -> None:
    """The router runs under uvloop (``progrouter serve``): lending a connection uses ``set_protocol``."""
    result: list[tuple[list[int], int, int]] = []
    thread = threading.Thread(target=lambda: result.append(uvloop.run(_keep_alive_scenario())))
    thread.start()
    thread.join(60)
    assert result == [([200, 200, 200], 2, 1)]


async def test_a_refusal_before_the_body_is_in_drops_the_rest_and_keeps_or_ends_the_connection(
    make_worker: WorkerFactory, make_router: RouterFactory
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], client_api_keys=["sesame"])
    key = "Authorization: Bearer sesame\r\n"
    async with await Conn.open(router) as conn:
        router.state.draining = True  # the drain's 503 keeps the connection
        request = post(extra=key)
        await conn.send(request[:-5])
        status, headers, _body = await conn.reply()
        assert status == 503 and headers["retry-after"] == "1" and "connection" not in headers
        router.state.draining = False
        await conn.send(request[-5:] + post(extra=key))  # the rest of the refused body, then a new request
        assert (await conn.reply())[0] == 200
        assert [r["raw"] for r in worker.requests] == [BODY]
        await conn.send(post(extra="Authorization: Bearer wrong\r\n")[:-5])  # a bad key ends the connection
        status, headers, _body = await conn.reply()
        assert status == 401 and headers["connection"] == "close"
        await conn.send(BODY[-5:])
        assert await conn.closed()
        assert len(worker.requests) == 1


def test_the_front_door_is_on_by_default_and_the_flag_turns_it_off() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from_args(parser.parse_args([]), {}).front_door is True
    assert config_from_args(parser.parse_args(["--no-front-door"]), {}).front_door is False


async def test_with_the_front_door_off_aiohttp_serves_every_route(
    make_worker: WorkerFactory, make_router: RouterFactory
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], front_door=False)
    assert router.front_door is None
    async with await Conn.open(router) as conn:
        await conn.send(post())
        status, headers, _body = await conn.reply()
        assert status == 200 and headers["x-request-id"].startswith("chatcmpl-")
        assert [r["raw"] for r in worker.requests] == [BODY]


async def test_a_large_stream_to_a_client_that_reads_late_arrives_whole(make_router: RouterFactory) -> None:
    """The router stops reading the worker while the client's socket is full (back-pressure), and the
    stream arrives byte for byte once the client reads."""
    chunk = bytes(range(256)) * 256  # 64 KiB
    chunks = 384  # 24 MiB: more than the sockets' buffers along the way hold
    written: list[int] = []

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(chunks):
            await response.write(chunk)
            written.append(len(chunk))
        await response.write_eof()
        return response

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post(CHAT, stream)
    app.router.add_get("/health", health)
    runner, url = await serve_app(app)
    try:
        router = await make_router([url])
        async with await Conn.open(router) as conn:
            await conn.send(post())
            status, _headers = await conn.head()
            assert status == 200
            async with asyncio.timeout(30):  # the worker stalls: its writes wait for the client
                while True:
                    before = sum(written)
                    await asyncio.sleep(0.5)
                    if sum(written) == before:
                        break
            assert sum(written) < chunks * len(chunk)
            body = b""
            while size := int((await conn.reader.readuntil(b"\r\n")).strip(), 16):
                body += await conn.reader.readexactly(size)
                await conn.reader.readexactly(2)
            assert body == chunk * chunks and sum(written) == len(body)
    finally:
        await runner.cleanup()
