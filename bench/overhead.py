"""Router overhead: router CPU per request, added latency and requests/s, progrouter beside upstream.

The worker and each router run in their own process (uvloop), the load generator in this one. Both routers
get the same flags (round_robin, one trivial loopback worker, Program scheduling on) and the same loads:
plain chat completions and Program ones (an ``agentic_context``), at concurrency 1 and 32. Each load also
goes straight to the worker, so "added p50" is the router's median minus the direct one. "CPU µs/req" is the
router's process-tree CPU time (user+system, from /proc) over the requests it proxied: wall time on a shared
machine says little, CPU time says what the router costs. The upstream wheel is measured when
``.venv-upstream/bin/vllm-router`` exists (``make upstream``). The "aiohttp floor" row is the trivial worker's
own CPU per request under the same loads (an aiohttp server with one handler and no proxying): what any
router served by aiohttp spends before doing anything. ``--profile`` runs progrouter under cProfile and
prints its top functions by own time.

    .venv/bin/python bench/overhead.py [--requests 4000] [--repeat 3] [--profile [OUT]]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from _loopback import free_port as _free_port
from _loopback import tree_cpu as _tree_cpu
from _loopback import wait_ready as _wait_ready

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = ROOT / ".venv-upstream" / "bin" / "vllm-router"
_MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]
PLAIN = json.dumps({"model": "bench", "messages": _MESSAGES, "max_tokens": 4, "stream": False}).encode()
PROGRAMS = 8  # distinct Programs the Program load cycles through
FLOOR = "aiohttp floor"


def program_body(i: int) -> bytes:
    context = json.dumps({"task_id": f"task-{i % PROGRAMS}", "agent_id": "lead"})
    body = {"model": "bench", "messages": _MESSAGES, "max_tokens": 4, "stream": False}
    return json.dumps({**body, "vllm_xargs": {"agentic_context": context}}).encode()


ANSWER = (
    b'{"id": "cmpl-1", "object": "chat.completion", "model": "bench", "choices": [{"index": 0,'
    b' "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],'
    b' "usage": {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}}'
)
LOADS = {"plain": lambda _i: PLAIN, "program": program_body}


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
    app.router.add_get("/v1/models", health)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def serve_profiled(out: str, argv: list[str]) -> None:
    """progrouter's CLI under cProfile; SIGTERM ends it through SystemExit so the profile is written."""
    from progrouter.cli import main as cli_main

    def _stop(_signum: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _stop)
    profiler = cProfile.Profile(time.process_time)  # CPU time: a loaded machine's waits are not the router's
    try:
        profiler.runcall(cli_main, argv)
    except (SystemExit, KeyboardInterrupt):
        pass
    finally:
        profiler.dump_stats(out)


@dataclass
class Cell:
    """One load against one target."""

    rps: float
    p50_ms: float


async def _load(session: aiohttp.ClientSession, url: str, load: str, requests: int, concurrency: int) -> Cell:
    latencies: list[float] = []
    sent = 0
    headers = {"Content-Type": "application/json"}
    body_of = LOADS[load]

    async def one_client() -> None:
        nonlocal sent
        while sent < requests:
            body = body_of(sent)
            sent += 1
            start = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                assert resp.status == 200, (resp.status, await resp.text())
            latencies.append(time.perf_counter() - start)

    began = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    wall = time.perf_counter() - began
    return Cell(len(latencies) / wall, statistics.median(latencies) * 1e3)


@dataclass
class Row:
    """One router and one load: CPU per request, added p50 at concurrency 1, req/s at concurrency 32."""

    router: str
    load: str
    cpu_us: float
    sys_us: float  # the system part of cpu_us: loopback TCP is charged to the sender as system time
    added_p50_ms: float
    rps_32: float


def _router_argv(router: str, worker_port: int, port: int) -> list[str]:
    flags = [
        "--worker-urls", f"http://127.0.0.1:{worker_port}",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--policy", "round_robin",
        "--prometheus-port", str(_free_port()),
        "--log-level", "warning",
        "--enable-program-scheduling",
    ]  # fmt: skip
    extra = os.environ.get("OVERHEAD_SERVE_FLAGS", "").split()  # e.g. --no-front-door (a12front's A/B hook)
    return [str(UPSTREAM), *flags] if router == "upstream" else ["serve", *flags, *extra]


async def measure(
    router: str, worker_port: int, requests: int, profile: str | None
) -> tuple[list[Row], dict[str, Cell]]:
    """Start ``router``, run both loads through it (and straight to the worker), return its rows."""
    port = _free_port()
    argv = _router_argv(router, worker_port, port)
    if router == "upstream":
        cmd = argv
    elif profile is not None:
        cmd = [sys.executable, __file__, "--serve-profiled", profile, "--", *argv]
    else:
        cmd = [sys.executable, "-m", "progrouter", *argv]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL)
    direct = f"http://127.0.0.1:{worker_port}/v1/chat/completions"
    routed = f"http://127.0.0.1:{port}/v1/chat/completions"
    rows, directs = [], {}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
            await _wait_ready(session, f"http://127.0.0.1:{port}/liveness")
            for load in LOADS:
                await _load(session, routed, load, min(500, requests), 1)  # warm-up
                cpu0 = _tree_cpu(proc.pid)
                one = await _load(session, routed, load, requests, 1)
                many = await _load(session, routed, load, requests, 32)
                cpu1 = _tree_cpu(proc.pid)
                per_request = [
                    (after - before) / (2 * requests) * 1e6 for after, before in zip(cpu1, cpu0, strict=True)
                ]
                directs[load] = await _load(session, direct, load, requests, 1)
                rows.append(
                    Row(
                        router,
                        load,
                        sum(per_request),
                        per_request[1],
                        one.p50_ms - directs[load].p50_ms,
                        many.rps,
                    )
                )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    return rows, directs


async def measure_floor(worker_pid: int, worker_port: int, requests: int) -> list[Row]:
    """The trivial worker's own CPU per request under each load, driven as the routers are."""
    url = f"http://127.0.0.1:{worker_port}/v1/chat/completions"
    rows = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        for load in LOADS:
            cpu0 = _tree_cpu(worker_pid)
            await _load(session, url, load, requests, 1)
            many = await _load(session, url, load, requests, 32)
            cpu1 = _tree_cpu(worker_pid)
            per_request = [
                (after - before) / (2 * requests) * 1e6 for after, before in zip(cpu1, cpu0, strict=True)
            ]
            rows.append(Row(FLOOR, load, sum(per_request), per_request[1], 0.0, many.rps))
    return rows


def print_profile(path: str, top: int) -> None:
    print(f"\nprogrouter under cProfile, top {top} by own time (tottime):")
    pstats.Stats(path).strip_dirs().sort_stats("tottime").print_stats(top)
    print(f"progrouter's own functions, top {top} by cumulative time:")
    pstats.Stats(path).sort_stats("cumulative").print_stats("progrouter/", top)


def summarize(runs: list[list[Row]]) -> None:
    """Min and median over the repeats, per router and load; "× upstream" is the median of each run's own
    CPU ratio (a shared machine inflates both routers' figures alike within one run, not across runs)."""
    keys = [(r.router, r.load) for r in runs[0]]
    header = (
        f"{'router':>13} {'load':>8} | {'CPU µs/req min':>14} {'median':>7} {'(sys)':>6} {'× upstream':>10}"
        f" | {'added p50 ms min':>16} {'median':>7} | {'req/s@32 max':>12} {'median':>7}"
    )
    print(header)
    print("-" * len(header))
    for router, load in keys:
        cells = [r for run in runs for r in run if (r.router, r.load) == (router, load)]
        cpu = [c.cpu_us for c in cells]
        p50 = [c.added_p50_ms for c in cells]
        rps = [c.rps_32 for c in cells]
        ratios = [
            mine.cpu_us / theirs.cpu_us
            for run in runs
            for mine in run
            for theirs in run
            if (mine.router, mine.load) == (router, load)
            and (theirs.router, theirs.load) == ("upstream", load)
        ]
        ratio = f"{statistics.median(ratios):.2f}" if ratios and router != "upstream" else "-"
        print(
            f"{router:>13} {load:>8} | {min(cpu):>14.0f} {statistics.median(cpu):>7.0f}"
            f" {statistics.median(c.sys_us for c in cells):>6.0f} {ratio:>10}"
            f" | {min(p50):>16.3f} {statistics.median(p50):>7.3f}"
            f" | {max(rps):>12.0f} {statistics.median(rps):>7.0f}"
        )


async def bench(requests: int, repeat: int, profile: str | None) -> None:
    worker_port = _free_port()
    worker = subprocess.Popen([sys.executable, __file__, "--serve-worker", str(worker_port)])
    routers = ["progrouter", *(["upstream"] if UPSTREAM.exists() else [])]
    runs: list[list[Row]] = []
    try:
        async with aiohttp.ClientSession() as session:
            await _wait_ready(session, f"http://127.0.0.1:{worker_port}/health")
        if profile is not None:
            with tempfile.TemporaryDirectory() as tmp:
                out = profile or os.path.join(tmp, "router.prof")
                await measure("progrouter", worker_port, requests, out)
                print_profile(out, 30)
            return
        for _ in range(repeat):
            run: list[Row] = []
            for router in routers:
                run.extend((await measure(router, worker_port, requests, None))[0])
            run.extend(await measure_floor(worker.pid, worker_port, requests))
            runs.append(run)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    print(
        f"router overhead, round_robin, 1 loopback worker, 4-token completion, {requests} requests per cell,"
        f" {repeat} runs, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    if not UPSTREAM.exists():
        print("(upstream not measured: `make upstream` installs .venv-upstream)")
    summarize(runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--profile",
        nargs="?",
        const="",
        default=None,
        metavar="OUT",
        help="progrouter under cProfile (CPU time); print its top functions, keep the stats in OUT if given",
    )
    parser.add_argument("--serve-worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--serve-profiled", default=None, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.serve_worker is not None:
        serve_worker(args.serve_worker)
        return 0
    if args.serve_profiled is not None:
        serve_profiled(args.serve_profiled, [a for a in rest if a != "--"])
        return 0
    import uvloop

    uvloop.run(bench(args.requests, args.repeat, args.profile))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
