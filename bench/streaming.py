"""Streamed requests: router CPU per SSE chunk, progrouter (plain and Program) beside upstream, in one run.

A loopback worker answers every chat completion with ``--chunks`` one-token SSE chunks ``--gap-ms`` apart
(then a usage chunk and ``[DONE]``); ``--streams`` clients stream at once through the router. "CPU µs/chunk"
is the router's process-tree CPU time (user + system, from /proc) over the run, divided by the token chunks
it relayed. Both routers get the same flags (``round_robin``, one worker, Program scheduling on); the
Program load adds an ``agentic_context`` (8 Programs). Each load runs once per router, loads and routers
alternating, and the ratios are taken within the run.

    .venv/bin/python bench/streaming.py [--streams 64] [--chunks 256] [--gap-ms 5] [--burn N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

import aiohttp
from aiohttp import web

from _loopback import cpu_burners, free_port, loadavg, run_worker, stop, tree_cpu, wait_ready
from overhead import PROGRAMS, UPSTREAM, router_argv

_MESSAGES = [{"role": "user", "content": "Count."}]
LOADS = ("plain", "program")


def request_body(load: str, i: int) -> bytes:
    body: dict[str, object] = {
        "model": "bench",
        "messages": _MESSAGES,
        "max_tokens": 256,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if load == "program":
        context = json.dumps({"task_id": f"task-{i % PROGRAMS}", "agent_id": "lead"})
        body["vllm_xargs"] = {"agentic_context": context}
    return json.dumps(body).encode()


def _chunk(delta: dict[str, object], usage: dict[str, int] | None = None) -> bytes:
    choices = [] if usage is not None else [{"index": 0, "delta": delta, "finish_reason": None}]
    event: dict[str, object] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "bench",
        "choices": choices,
    }
    if usage is not None:
        event["usage"] = usage
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def serve_worker(port: int, chunks: int, gap: float) -> None:
    """The streaming worker: ``chunks`` one-token chunks ``gap`` seconds apart, a usage chunk, ``[DONE]``."""
    token = _chunk({"content": "x"})
    usage = _chunk({}, {"prompt_tokens": 8, "completion_tokens": chunks, "total_tokens": 8 + chunks})

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        for _ in range(chunks):
            await asyncio.sleep(gap)
            await stream.write(token)
        await stream.write(usage + b"data: [DONE]\n\n")
        await stream.write_eof()
        return stream

    run_worker(port, chat)


async def _streams(session: aiohttp.ClientSession, url: str, load: str, streams: int, chunks: int) -> None:
    async def one(i: int) -> None:
        async with session.post(
            url, data=request_body(load, i), headers={"Content-Type": "application/json"}
        ) as r:
            body = await r.read()
            assert r.status == 200, (r.status, body[:200])
            assert body.count(b'"content": "x"') == chunks and body.endswith(b"data: [DONE]\n\n"), body[-200:]

    await asyncio.gather(*(one(i) for i in range(streams)))


async def bench(streams: int, chunks: int, gap: float) -> None:
    worker_port = free_port()
    worker_cmd = [sys.executable, __file__, "--serve-worker", str(worker_port), str(chunks), str(gap)]
    worker = subprocess.Popen(worker_cmd)
    routers = ["progrouter", *(["upstream"] if UPSTREAM.exists() else [])]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    urls: dict[str, str] = {}
    cpu: dict[tuple[str, str], float] = {}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await wait_ready(session, f"http://127.0.0.1:{worker_port}/health")
            for router in routers:
                port = free_port()
                argv = router_argv(router, worker_port, port)
                cmd = argv if router == "upstream" else [sys.executable, "-m", "progrouter", *argv]
                env = {**os.environ, "PYTHONUNBUFFERED": "1"}
                procs[router] = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
                urls[router] = f"http://127.0.0.1:{port}/v1/chat/completions"
                await wait_ready(session, f"http://127.0.0.1:{port}/liveness")
                for load in LOADS:  # warm-up: connections, Programs
                    await _streams(session, urls[router], load, 8, chunks)
            began = time.monotonic()
            for load in LOADS:
                for router in routers if load == "plain" else routers[::-1]:
                    before = sum(tree_cpu(procs[router].pid))
                    await _streams(session, urls[router], load, streams, chunks)
                    cpu[(router, load)] = (
                        (sum(tree_cpu(procs[router].pid)) - before) / (streams * chunks) * 1e6
                    )
            wall = time.monotonic() - began
    finally:
        stop(procs.values(), worker)
    print(
        f"streaming: {streams} streams at once, {chunks} one-token SSE chunks each, {gap * 1e3:g} ms apart;"
        f" {wall:.0f} s; {os.cpu_count()} CPUs; /proc/loadavg at the end: {loadavg()}"
    )
    print(f"{'load':>8} | {'router CPU µs/chunk':>20} {'upstream':>9} {'× upstream':>10}")
    for load in LOADS:
        theirs = cpu.get(("upstream", load))
        ratio = f"{cpu[('progrouter', load)] / theirs:>10.2f}" if theirs else f"{'-':>10}"
        upstream = f"{theirs:>9.1f}" if theirs is not None else f"{'-':>9}"
        print(f"{load:>8} | {cpu[('progrouter', load)]:>20.1f} {upstream} {ratio}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--chunks", type=int, default=256)
    parser.add_argument("--gap-ms", type=float, default=5.0)
    parser.add_argument("--burn", type=int, default=0, metavar="N", help="N CPU-burning processes meanwhile")
    parser.add_argument("--serve-worker", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_worker is not None:
        port, chunks, gap = args.serve_worker
        serve_worker(int(port), int(chunks), float(gap))
        return 0
    import uvloop

    with cpu_burners(args.burn):
        uvloop.run(bench(args.streams, args.chunks, args.gap_ms / 1e3))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
