"""Router overhead: requests/s and added latency of `progrouter serve` against a trivial loopback worker.

The worker and the router each run in their own process (uvloop), the load generator in this one. Each
load is sent straight to the worker and through the router (round_robin, one worker), at concurrency 1
and 64; "added" is the router's percentile minus the direct one. The client's own cost is in both arms.

    .venv/bin/python bench/overhead.py [--requests 4000] [--concurrency 1 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import aiohttp
from aiohttp import web

BODY = (
    b'{"model": "bench", "messages": [{"role": "system", "content": "You are terse."},'
    b' {"role": "user", "content": "Say hi."}], "max_tokens": 4, "stream": false}'
)
ANSWER = (
    b'{"id": "cmpl-1", "object": "chat.completion", "model": "bench", "choices": [{"index": 0,'
    b' "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],'
    b' "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}}'
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_worker(port: int) -> None:
    """The trivial worker: a fixed chat completion, and /health."""
    import uvloop

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


async def _wait_ready(session: aiohttp.ClientSession, url: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            async with session.get(url) as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up")
        await asyncio.sleep(0.05)


@dataclass
class Result:
    rps: float
    p50_ms: float
    p99_ms: float


async def _load(session: aiohttp.ClientSession, url: str, requests: int, concurrency: int) -> Result:
    latencies: list[float] = []
    remaining = requests
    headers = {"Content-Type": "application/json"}

    async def one_client() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            async with session.post(url, data=BODY, headers=headers) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            latencies.append(time.perf_counter() - start)

    began = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    wall = time.perf_counter() - began
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return Result(len(latencies) / wall, q[49] * 1e3, q[98] * 1e3)


async def bench(requests: int, concurrencies: list[int]) -> list[tuple[int, Result, Result]]:
    worker_port, router_port = _free_port(), _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    worker = subprocess.Popen([sys.executable, __file__, "--serve-worker", str(worker_port)], env=env)
    router = subprocess.Popen(
        [
            sys.executable, "-m", "progrouter", "serve",
            "--worker-urls", f"http://127.0.0.1:{worker_port}",
            "--port", str(router_port),
            "--policy", "round_robin",
            "--prometheus-port", "0",
            "--log-level", "warning",
        ],
        env=env,
    )  # fmt: skip
    direct = f"http://127.0.0.1:{worker_port}"
    routed = f"http://127.0.0.1:{router_port}"
    rows = []
    try:
        connector = aiohttp.TCPConnector(limit=max(concurrencies))
        async with aiohttp.ClientSession(connector=connector) as session:
            await _wait_ready(session, direct + "/health")
            await _wait_ready(session, routed + "/liveness")
            for concurrency in concurrencies:
                results = {}
                for name, base in (("direct", direct), ("router", routed)):
                    await _load(
                        session, base + "/v1/chat/completions", min(500, requests), concurrency
                    )  # warm-up
                    results[name] = await _load(session, base + "/v1/chat/completions", requests, concurrency)
                rows.append((concurrency, results["direct"], results["router"]))
    finally:
        for proc in (router, worker):
            proc.terminate()
            proc.wait(timeout=30)
    return rows


def print_table(rows: list[tuple[int, Result, Result]], requests: int) -> None:
    print(
        f"progrouter overhead, round_robin, 1 loopback worker, {requests} requests per cell,"
        f" {os.cpu_count()} CPUs"
    )
    header = (
        f"{'conc':>4} | {'direct req/s':>12} {'p50 ms':>7} {'p99 ms':>7} | {'router req/s':>12} {'p50 ms':>7}"
        f" {'p99 ms':>7} | {'added p50 ms':>12} {'added p99 ms':>12}"
    )
    print(header)
    print("-" * len(header))
    for concurrency, d, r in rows:
        print(
            f"{concurrency:>4} | {d.rps:>12.0f} {d.p50_ms:>7.3f} {d.p99_ms:>7.3f}"
            f" | {r.rps:>12.0f} {r.p50_ms:>7.3f} {r.p99_ms:>7.3f}"
            f" | {r.p50_ms - d.p50_ms:>12.3f} {r.p99_ms - d.p99_ms:>12.3f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--serve-worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_worker is not None:
        serve_worker(args.serve_worker)
        return 0
    import uvloop

    rows = uvloop.run(bench(args.requests, args.concurrency))
    print_table(rows, args.requests)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
