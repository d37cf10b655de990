"""Slow clients are cut off within the configured timeouts, and the router stays responsive meanwhile.

Five patterns: a head trickled byte by byte, a body trickled, a chunked body that never ends, an idle
keep-alive connection (and one that never sends anything), and a thousand half-sent requests at once (with
one more connection, past the bound, refused). Every wait here is a bounded deadline: the configured timeout
plus slack for a loaded machine, never a measured duration.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest

from progrouter.server.runner import RunningRouter
from support.factories import EngineFactory, RouterFactory

from .conftest import PROGRAM, assert_alive, host_port, parse_reply, read_reply

TIMEOUT = 0.5
SLACK = 5.0  # the cut-off must come within TIMEOUT + SLACK
HALF_SENT = 1000
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n"


@pytest.fixture
async def router(make_engine: EngineFactory, make_router: RouterFactory) -> RunningRouter:
    engine = await make_engine()
    return await make_router(
        [engine.url],
        PROGRAM,
        client_header_timeout_secs=TIMEOUT,
        client_body_timeout_secs=TIMEOUT,
        client_keepalive_timeout_secs=TIMEOUT,
    )


@contextlib.asynccontextmanager
async def connection(
    router: RunningRouter,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection(*host_port(router.url))
    try:
        yield reader, writer
    finally:
        writer.close()


async def trickle(writer: asyncio.StreamWriter, pieces: list[bytes], every: float = 0.05) -> None:
    """Send ``pieces`` one at a time until the server hangs up (then stop quietly)."""
    with contextlib.suppress(ConnectionError):
        for piece in pieces:
            if writer.is_closing():
                return
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(every)


async def cut_off_with(reader: asyncio.StreamReader, status: int) -> str:
    """The reply is ``status`` with a JSON reason, then the server closes; all within the deadline."""
    async with asyncio.timeout(TIMEOUT + SLACK):
        reply = parse_reply(await read_reply(reader))
        assert reply.status == status, reply
        await closed(reader)
    return reply.error()


async def closed(reader: asyncio.StreamReader) -> None:
    """The server ended the connection: EOF, or a reset when it closed with the client's bytes unread."""
    with contextlib.suppress(ConnectionResetError):
        assert await reader.read() == b""


async def test_trickled_head_gets_408(router: RunningRouter, client: aiohttp.ClientSession) -> None:
    async with connection(router) as (reader, writer):
        forever = [bytes([c]) for c in HEAD + b"X-Slow: " + b"a" * 100_000]
        sender = asyncio.create_task(trickle(writer, forever))
        await assert_alive(client, router)
        assert "head" in await cut_off_with(reader, 408)
        sender.cancel()
    await assert_alive(client, router)


async def test_trickled_body_gets_408(router: RunningRouter, client: aiohttp.ClientSession) -> None:
    async with connection(router) as (reader, writer):
        writer.write(HEAD + b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
        sender = asyncio.create_task(trickle(writer, [b"{"] + [b" "] * 100_000))
        await assert_alive(client, router)
        assert "body" in await cut_off_with(reader, 408)
        sender.cancel()
    await assert_alive(client, router)


async def test_content_length_longer_than_the_body_gets_408(
    router: RunningRouter, client: aiohttp.ClientSession
) -> None:
    async with connection(router) as (reader, writer):
        writer.write(HEAD + b"Content-Length: 100\r\n\r\n" + b'{"prompt": "x"}')  # 15 of 100, then silence
        assert "body" in await cut_off_with(reader, 408)
    await assert_alive(client, router)


async def test_never_ending_chunked_body_gets_408(
    router: RunningRouter, client: aiohttp.ClientSession
) -> None:
    async with connection(router) as (reader, writer):
        writer.write(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
        sender = asyncio.create_task(trickle(writer, [b"1\r\n \r\n"] * 1_000_000, every=0.001))
        assert "body" in await cut_off_with(reader, 408)
        sender.cancel()
    await assert_alive(client, router)


async def test_idle_connections_are_closed(router: RunningRouter, client: aiohttp.ClientSession) -> None:
    async with connection(router) as (reader, writer):  # never sends a byte
        async with asyncio.timeout(TIMEOUT + SLACK):
            await closed(reader)
    async with connection(router) as (reader, writer):  # one request, then idle keep-alive
        writer.write(b"GET /liveness HTTP/1.1\r\nHost: r\r\n\r\n")
        async with asyncio.timeout(TIMEOUT + SLACK):
            assert parse_reply(await read_reply(reader)).status == 200
            await closed(reader)
    await assert_alive(client, router)


async def test_a_thousand_half_sent_requests_are_bounded_and_cut_off(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router(
        [engine.url],
        PROGRAM,
        client_header_timeout_secs=TIMEOUT,
        client_keepalive_timeout_secs=60.0,  # the connections stay while they are being opened
        max_client_connections=HALF_SENT,
    )
    opened = [await asyncio.open_connection(*host_port(router.url)) for _ in range(HALF_SENT)]
    try:
        async with connection(router) as (reader, _):  # past the bound: refused at once
            assert "connections" in await cut_off_with(reader, 503)
        for _, writer in opened:
            writer.write(HEAD + b"X-Half: ")
        replies = await asyncio.gather(*(cut_off_with(reader, 408) for reader, _ in opened))
        assert len(replies) == HALF_SENT
    finally:
        for _, writer in opened:
            writer.close()
    await assert_alive(client, router)  # every slot is free again
