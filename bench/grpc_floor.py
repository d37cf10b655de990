"""The floor under the EPP: what Python's gRPC costs a server per ext_proc-shaped stream, with no work at all.

Envoy opens one bidirectional gRPC stream per request to the EPP and exchanges 3–4 messages on it (request
headers, request body, response headers, perhaps response body). This bench serves an echo of that shape:
a bidirectional stream whose handler answers each message with the same bytes, nothing else. A client in
this process opens ``--streams`` streams, ``--concurrency`` at a time, and exchanges ``--messages`` messages
of 200 bytes on each. It prints the server process's CPU (user + system, from /proc) per stream and per
message, for grpc.aio (as `progrouter epp` serves), grpc.aio on uvloop, and the thread-pool server.

What `bench/epp.py` reports as the EPP's CPU per request is this floor plus the EPP's own work.

    .venv/bin/python bench/grpc_floor.py [--streams 3000] [--messages 4] [--servers aio,aio-uvloop,sync]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from concurrent import futures

import grpc

from _loopback import free_port, tree_cpu

SERVICE, METHOD = "progrouter.bench.Echo", "Stream"
PAYLOAD = b"x" * 200


def _handlers(behaviour: grpc.RpcMethodHandler) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(SERVICE, {METHOD: behaviour})


def serve_aio(port: int, use_uvloop: bool) -> None:
    """An echo on grpc.aio that reads and writes through the context, as the EPP's ``Processor`` does."""

    async def echo(_requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]) -> None:
        while True:
            message = await context.read()
            if message is grpc.aio.EOF:
                return
            await context.write(message)

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_handlers(grpc.stream_stream_rpc_method_handler(echo)),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    if use_uvloop:
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def serve_sync(port: int) -> None:
    """The same echo on grpc's thread-pool server."""

    def echo(requests: Iterator[bytes], _context: grpc.ServicerContext) -> Iterator[bytes]:
        yield from requests

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    server.add_generic_rpc_handlers((_handlers(grpc.stream_stream_rpc_method_handler(echo)),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


async def drive(port: int, streams: int, messages: int, concurrency: int) -> float:
    """Open ``streams`` echo streams, ``concurrency`` at a time; the wall seconds it took."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(f"/{SERVICE}/{METHOD}")
        opened = 0

        async def one_client() -> None:
            nonlocal opened
            while opened < streams:
                opened += 1
                stream = call()
                for _ in range(messages):
                    await stream.write(PAYLOAD)
                    await stream.read()
                await stream.done_writing()
                await stream.read()  # the end of the stream

        began = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        return time.perf_counter() - began


def wait_listening(port: int) -> None:
    async def ready() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await asyncio.wait_for(channel.channel_ready(), 30)

    asyncio.run(ready())


def measure(server: str, streams: int, messages: int) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", server, "--port", str(port)])
    try:
        wait_listening(port)
        asyncio.run(drive(port, 200, messages, 8))  # warm-up
        for concurrency in (1, 16):
            before = sum(tree_cpu(proc.pid))
            wall = asyncio.run(drive(port, streams, messages, concurrency))
            used = sum(tree_cpu(proc.pid)) - before
            print(
                f"{server:>10} c={concurrency:<2} | {used / streams * 1e6:7.0f} µs/stream"
                f" {used / (streams * messages) * 1e6:6.0f} µs/message | {streams / wall:6.0f} streams/s"
            )
    finally:
        proc.kill()
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=3000)
    parser.add_argument("--messages", type=int, default=4, help="messages each way per stream")
    parser.add_argument("--servers", default="aio,aio-uvloop,sync")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        if args.serve == "sync":
            serve_sync(args.port)
        else:
            serve_aio(args.port, use_uvloop=args.serve == "aio-uvloop")
        return 0
    print(
        f"gRPC echo server CPU, one bidirectional stream per request, {args.messages} messages of"
        f" {len(PAYLOAD)} bytes each way, {args.streams} streams per cell, grpcio {grpc.__version__}"
    )
    for server in args.servers.split(","):
        measure(server, args.streams, args.messages)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
