"""How long ``/scheduling/diagnostics`` takes to render, how large it is, and what it costs ``/liveness``.

Builds a ``ProgramScheduler`` in-process with ``--programs`` Programs over ``--ranks`` Ranks (fake clock: each
Program completes one request and stays Paused, as distinct agents leave it), then:

1. renders the snapshot the way the route does (``scheduler.diagnostics`` + ``orjson``) for a few pages and
   prints, per page, the render time (best and median of ``--repeat``) and the bytes; the same for the
   dashboard's summary (Rank aggregates, counts and a page of 50 Programs: all, retained, running);
2. serves it over HTTP from this process's event loop (uvloop, aiohttp: ``GET /scheduling/diagnostics`` does
   what the router's handler does, ``json_response(scheduler.diagnostics(now, **page))``, and ``GET
   /liveness`` answers at once) and, from two processes of their own, probes ``/liveness`` every 10 ms while
   another fetches the diagnostics back to back for ``--seconds``; prints the liveness latency p50/p99/max
   with and without those fetches. A render holds the loop, so the liveness latency during renders is what
   a render costs every other request of the router.

    .venv/bin/python bench/diagnostics.py [--programs 50000] [--ranks 8] [--limit 500]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

import orjson
from aiohttp import web

from _loopback import free_port
from progrouter.config import ProgramSchedulingConfig
from progrouter.program import (
    Dispatched,
    ProgramIdentity,
    ProgramRequest,
    ProgramScheduler,
    RequestHints,
    UsageObservation,
)
from progrouter.routing.target import Target
from progrouter.server.dashboard.summary import Summary
from progrouter.server.edge.errors import json_response

POOL = "program:model:m"


def build(programs: int, ranks: int) -> ProgramScheduler:
    config = ProgramSchedulingConfig(max_paused_programs=programs)
    scheduler = ProgramScheduler(config)
    scheduler.set_ranks(POOL, [Target.parse(f"http://w:1@{r}") for r in range(ranks)], 0.0)
    for i in range(programs):
        now = i * 0.001
        pid = f"task-{i}:agent"
        identity = ProgramIdentity(
            program_id=pid, placement_key=pid, placement_hash_key=f"header:x:{pid}", task_id=f"task-{i}"
        )
        scheduler.arrive(now, ProgramRequest(identity, RequestHints(request_id=f"r{i}"), POOL, 500))
        for outcome in scheduler.take_outcomes():
            assert isinstance(outcome, Dispatched)
            usage = UsageObservation(prompt_tokens=500, completion_tokens=10)
            scheduler.complete(now, outcome.dispatch, success=True, usage=usage)
        scheduler.take_outcomes()
    return scheduler


def render_times(scheduler: ProgramScheduler, now: float, repeat: int) -> None:
    print(f"{'page':>12} {'programs':>9} {'best ms':>8} {'median ms':>10} {'bytes':>11}")
    pages: list[tuple[str, dict[str, int]]] = [
        ("default", {}),
        ("limit=5000", {"limit": 5000}),
        ("offset=40000", {"offset": 40000}),
    ]
    for label, page in pages:
        times: list[float] = []
        size = listed = 0
        for _ in range(repeat):
            t0 = time.perf_counter()
            snapshot = scheduler.diagnostics(now, **page)
            size = len(orjson.dumps(snapshot))
            times.append((time.perf_counter() - t0) * 1000)
            listed = sum(len(rank["programs"]) for rank in snapshot["ranks"])
        print(f"{label:>12} {listed:>9} {min(times):>8.1f} {statistics.median(times):>10.1f} {size:>11,}")
    for state in (None, "retained", "running"):  # the dashboard's push: its summary and one page of 50
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            summary = Summary(scheduler, now)
            summary.counts()
            size = len(orjson.dumps(summary.page(0, 50, state)))
            times.append((time.perf_counter() - t0) * 1000)
        label = f"summary {state or 'all'}"
        print(f"{label:>12} {50:>9} {min(times):>8.1f} {statistics.median(times):>10.1f} {size:>11,}")


# ------------------------------------------------------------------------------------------------ probes
def probe(path: str, port: int, seconds: float, pause: float) -> None:
    """In its own process: GET ``path`` for ``seconds`` on a kept-alive connection, every ``pause`` s;
    prints each latency in ms."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        assert response.status == 200, response.status
        print(f"{(time.perf_counter() - start) * 1e3:.3f}", flush=True)
        time.sleep(pause)


async def _probe(path: str, port: int, seconds: float, pause: float) -> list[float]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--probe", path, "--port", str(port), "--seconds", str(seconds),
        "--pause", str(pause), stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"probe of {path} failed ({proc.returncode})")
    return [float(line) for line in out.split()]


def _summary(values: list[float]) -> str:
    if len(values) < 2:
        return f"{len(values)} samples"
    q = statistics.quantiles(values, n=100, method="inclusive")
    return f"n {len(values):>5}  p50 {q[49]:8.1f} ms  p99 {q[98]:8.1f} ms  max {max(values):8.1f} ms"


async def over_http(scheduler: ProgramScheduler, now: float, args: argparse.Namespace) -> None:
    async def diagnostics(request: web.Request) -> web.Response:
        page = {k: int(v) for k, v in request.query.items() if k in ("offset", "limit")}
        return json_response(scheduler.diagnostics(now, **page))

    async def liveness(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    app = web.Application()
    app.router.add_get("/scheduling/diagnostics", diagnostics)
    app.router.add_get("/liveness", liveness)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        quiet = await _probe("/liveness", port, args.seconds / 2, 0.01)
        print(f"/liveness, no diagnostics:        {_summary(quiet)}")
        path = f"/scheduling/diagnostics?limit={args.limit}"
        busy, renders = await asyncio.gather(
            _probe("/liveness", port, args.seconds, 0.01), _probe(path, port, args.seconds, 0.0)
        )
        print(f"/liveness, diagnostics back to back: {_summary(busy)}")
        print(f"{path} itself:    {_summary(renders)}")
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=50_000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--limit", type=int, default=500, help="the page fetched over HTTP")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long diagnostics are fetched")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--pause", type=float, default=0.01, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe is not None:
        probe(args.probe, args.port, args.seconds, args.pause)
        return
    started = time.perf_counter()
    scheduler = build(args.programs, args.ranks)
    print(f"{args.programs} Programs over {args.ranks} Ranks built in {time.perf_counter() - started:.1f} s")
    now = args.programs * 0.001 + 1.0
    render_times(scheduler, now, args.repeat)
    import uvloop

    uvloop.run(over_http(scheduler, now, args))


if __name__ == "__main__":
    main()
