"""What the front door's pieces cost alone, in one process: how much replacing one of them could save.

Per plain request the front door parses one head with aiohttp's C parser (one parser per connection) and the
proxy builds one aiohttp ``web.Response``. This times, on a typical client head (9 fields) and a 4-token
JSON answer: aiohttp's parser fed the head (reused, as on a keep-alive connection, and new per head),
llhttp (``httptools``) checking the same head with no callback per field — the floor of any replacement
built on llhttp, before it splits a single field — and a ``web.Response``. Best of 7 repeats, µs per call.

    .venv/bin/python bench/front_pieces.py
"""

from __future__ import annotations

import asyncio
import os
import timeit
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from aiohttp.http_parser import HttpRequestParser
from httptools import HttpRequestParser as LlhttpParser
from multidict import CIMultiDict

HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: python-httpx/0.27\r\n"
    b"Accept: */*\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n"
    b"Content-Type: application/json\r\nContent-Length: 120\r\nx-program-id: agent-1\r\n"
    b"Authorization: Bearer k\r\n\r\n"
)
ANSWER = b'{"id":"c","object":"chat.completion","choices":[{"message":{"content":"hi"}}],"usage":{}}'
CALLS = 20_000


def _aiohttp_parser(loop: asyncio.AbstractEventLoop) -> HttpRequestParser:
    return HttpRequestParser(None, loop, 1 << 16, response_with_body=False, auto_decompress=False)


class _Complete:
    def on_headers_complete(self) -> None:
        pass


def best_us(call: Callable[[], object]) -> float:
    return min(timeit.repeat(call, number=CALLS, repeat=7)) / CALLS * 1e6


def main() -> None:
    loop = asyncio.new_event_loop()
    reused = _aiohttp_parser(loop)
    headers = [("Content-Type", "application/json"), ("x-request-id", "r")]
    rows = {
        "aiohttp's C parser, one per connection (the front door)": lambda: reused.feed_data(HEAD),
        "aiohttp's C parser, a new one per head": lambda: _aiohttp_parser(loop).feed_data(HEAD),
        "llhttp (httptools) checking the head, no field split": lambda: LlhttpParser(_Complete()).feed_data(
            HEAD
        ),
        "web.Response(status, body, headers)": lambda: web.Response(
            status=200, body=ANSWER, headers=CIMultiDict(headers)
        ),
    }
    print(f"{os.cpu_count()} CPUs, /proc/loadavg {Path('/proc/loadavg').read_text().strip()}")
    for name, call in rows.items():
        print(f"  {name:<60} {best_us(call):6.2f} µs")
    loop.close()


if __name__ == "__main__":
    main()
