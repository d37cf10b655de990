"""No log record above DEBUG carries what a hostile client sent: the corpus runs with planted markers in
prompt text, Program ids, header values, request lines and bodies, and every record the router, its
Program scheduler and aiohttp emit above DEBUG is searched for them (message, arguments and traceback)."""

from __future__ import annotations

import logging
import sys

import aiohttp
import pytest

from progrouter.server.edge.log_hygiene import ClientBytesFilter
from progrouter.server.runner import RunningRouter

from .conftest import assert_alive, exchange, json_post
from .corpus import CHAT_BODIES, MARK_HEADER, MARK_PROGRAM, MARK_PROMPT

MARKERS = (MARK_PROMPT, MARK_PROGRAM, MARK_HEADER)
HEADER = MARK_HEADER.encode()
RAW = [
    b"GET /" + HEADER + b" HTTP/9.9\r\nHost: r\r\n\r\n",
    HEADER + b" /v1/chat/completions HTTP/1.1\r\n\r\n",
    b"GET /liveness HTTP/1.1\r\nAuthorization: Bearer " + HEADER * 5000 + b"\r\n\r\n",
    b"GET /liveness HTTP/1.1\r\nX-A: " + HEADER + b"\x00\r\n\r\n",
    b"GET /liveness HTTP/1.1\r\nX-A: " + HEADER + b"\rX-B: 1\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}" + HEADER,
    b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + HEADER + b"\r\n",
    b"POST /v1/completions HTTP/1.1\r\nContent-Length: " + HEADER + b"\r\n\r\n",
]


def _text(record: logging.LogRecord) -> str:
    parts = [record.getMessage(), str(record.args), record.exc_text or ""]
    if record.exc_info and record.exc_info[1] is not None:
        parts.append(repr(record.exc_info[1]))
    return " ".join(parts)


async def test_no_marker_reaches_a_log_above_debug(
    program_router: RunningRouter, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for data in RAW:
        await exchange(program_router.url, data)
    headers = {"X-Session-Id": MARK_HEADER, "X-Trace": MARK_HEADER, "Content-Type": "application/json"}
    for body in CHAT_BODIES.values():
        await json_post(client, program_router.url + "/v1/chat/completions", body, headers=headers)
    await assert_alive(client, program_router)
    above_debug = [r for r in caplog.records if r.levelno > logging.DEBUG]
    leaks = [(r.name, _text(r)[:200]) for r in above_debug if any(m in _text(r) for m in MARKERS)]
    assert leaks == []
    # the capture does see the corpus: each malformed request was logged (at DEBUG, by reason only)
    refusals = [r for r in caplog.records if r.name == "progrouter.edge"]
    assert len(refusals) >= len(RAW) - 1


def test_aiohttp_records_keep_their_fixed_text_and_lose_client_bytes() -> None:
    try:
        raise ValueError("secret " + MARK_PROMPT)
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord(
        "aiohttp.server",
        logging.ERROR,
        __file__,
        1,
        "Error handling request from %s: %r",
        ("1.2.3.4", HEADER),
        exc_info,
    )
    assert ClientBytesFilter().filter(record)
    assert record.getMessage() == "Error handling request from <…>: <…> (ValueError)"
    assert record.exc_info is None and MARK_PROMPT not in _text(record) and MARK_HEADER not in _text(record)
    debug = logging.LogRecord("aiohttp.server", logging.DEBUG, __file__, 1, "%s", (HEADER,), None)
    assert ClientBytesFilter().filter(debug) and MARK_HEADER in debug.getMessage()
