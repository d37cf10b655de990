"""Malformed HTTP at the socket: every case is answered with the JSON error shape and a reason, reaches no
worker, changes no Program state, and leaves the router healthy."""

from __future__ import annotations

import aiohttp
import pytest

from progrouter.server.runner import RunningRouter

from .conftest import assert_alive, diagnostics, exchange

CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nConnection: close\r\n"
BODY = b'{"model":"emu","messages":[{"role":"user","content":"hi"}]}'


def _post(headers: bytes, body: bytes = BODY) -> bytes:
    return CHAT + headers + b"Content-Length: %d\r\n\r\n" % len(body) + body


CASES: dict[str, tuple[bytes, int]] = {
    "CR splits a header": (_post(b"X-A: a\rX-data-parallel-rank: 7\r\n"), 400),
    "LF splits a header": (_post(b"X-A: a\nX-data-parallel-rank: 7\r\n"), 400),
    "obs-fold continuation": (_post(b"X-A: a\r\n X-data-parallel-rank: 7\r\n"), 400),
    "NUL in a header value": (_post(b"X-A: a\x00b\r\n"), 400),
    "NUL in a header name": (_post(b"X-\x00A: b\r\n"), 400),
    "garbage request line": (b"GARBAGE\r\n\r\n", 400),
    "unknown method": (b"BREW /v1/chat/completions HTTP/1.1\r\nHost: r\r\n\r\n", 400),
    "bad HTTP version": (b"GET /liveness HTTP/9.9\r\nHost: r\r\n\r\n", 400),
    "64 KiB header": (b"GET /liveness HTTP/1.1\r\nHost: r\r\nX-Big: " + b"A" * 65536 + b"\r\n\r\n", 431),
    "64 KiB Authorization": (
        b"GET /liveness HTTP/1.1\r\nHost: r\r\nAuthorization: Bearer " + b"K" * 65536 + b"\r\n\r\n",
        431,
    ),
    "64 KiB request target": (b"GET /" + b"a" * 65536 + b" HTTP/1.1\r\nHost: r\r\n\r\n", 431),
    "3000 headers": (
        b"GET /liveness HTTP/1.1\r\nHost: r\r\n"
        + b"".join(b"X-%d: v\r\n" % i for i in range(3000))
        + b"\r\n",
        431,
    ),
    "Content-Length not a number": (CHAT + b"Content-Length: abc\r\n\r\n{}", 400),
    "two Content-Lengths": (CHAT + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400),
    "Content-Length with chunked": (
        CHAT + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        400,
    ),
    "bad chunk size": (CHAT + b"Transfer-Encoding: chunked\r\n\r\nZZ\r\nxx\r\n0\r\n\r\n", 400),
    "Content-Length shorter than the body": (CHAT + b"Content-Length: 2\r\n\r\n{}GARBAGE", 400),
    "body over max_payload_size": (_post(b"", b'{"prompt": "' + b"x" * 70000 + b'"}'), 413),
    "unknown route": (b"GET /no/such/route HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n", 404),
    "DELETE an inference route": (
        b"DELETE /v1/chat/completions HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n",
        404,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
async def test_malformed_request_gets_a_json_4xx(
    program_router: RunningRouter, client: aiohttp.ClientSession, name: str
) -> None:
    router = program_router
    data, status = CASES[name]
    before = await diagnostics(client, router)
    reply = await exchange(router.url, data)
    assert reply.status == status, (name, reply)
    reply.error()
    assert await diagnostics(client, router) == before
    await assert_alive(client, router)
