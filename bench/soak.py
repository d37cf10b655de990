"""Soak and overload: the router's memory, file descriptors, event-loop lag and p99 over time.

`progrouter serve` (Program scheduling on) runs in its own process in front of one `progrouter engine`
process (two Ranks, high time scale); the load generator runs in this one. What is measured is the router's
process: RSS (``/proc/<pid>/status``), open descriptors (``/proc/<pid>/fd``), event-loop lag (the latency of
``GET /liveness``, probed every 50 ms from a process of its own, whose handler does nothing: what it takes is
time waiting for the router's loop), and the p99 latency of the load's requests, one row per interval.

Modes:
- ``distinct`` (default): ``--programs`` distinct Programs (100,000), ``--turns`` requests each, streaming
  and non-streaming alternately, ``--concurrency`` at a time. Prints RSS growth after the warm-up per
  100,000 Programs (target: under 20 MB) and whether descriptors and p99 stay flat.
- ``steady``: a mixed load for ``--minutes``: agents that come back to a working set of Programs plus new
  ones, and native requests.
- ``overload``: ``--overload-factor`` (10) times more concurrent Programs than the configured capacity
  holds comfortably, each running ``--turns`` turns; reports statuses (429s and their ``Retry-After``),
  queue waits (``vllm_router_agent_aware_queue_wait_seconds``), the most Programs active on one Rank,
  memory, and the router's own count of refusals (``progrouter_program_rejections_total`` by reason).

    .venv/bin/python bench/soak.py [--mode distinct|steady|overload] [--programs 100000] [--minutes 30]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from _loopback import free_port, wait_ready

MODEL = "soak"
PREFIX = "vllm_router_agent_aware_"
# One Program needs about PROMPT_WORDS + max_tokens + decode_buffer (100) tokens of the router's capacity.
PROMPT_WORDS = 120
MAX_TOKENS = 8
DISTINCT_CONFIG: dict[str, Any] = {"token_capacity_per_dp_rank": 60000, "metrics_interval_seconds": 0.5}
OVERLOAD_CONFIG: dict[str, Any] = {
    "token_capacity_per_dp_rank": 2000,
    "metrics_interval_seconds": 0.25,
    "queue_timeout_seconds": 20.0,
    "force_resume_timeout_seconds": 10.0,
    "max_acting_ttl_seconds": 1.0,
}


# ------------------------------------------------------------------------------------------------ processes
@dataclass
class Fleet:
    engine: subprocess.Popen[bytes]
    router: subprocess.Popen[bytes]
    url: str
    metrics_url: str

    def stop(self) -> None:
        for proc in (self.router, self.engine):
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start_fleet(program: dict[str, Any], time_scale: float, log_dir: str) -> Fleet:
    engine_port, router_port, metrics_port = free_port(), free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    os.makedirs(log_dir, exist_ok=True)

    def spawn(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(os.path.join(log_dir, f"{name}.log"), "wb") as log:  # the child keeps its own copy
            return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    engine = spawn(
        "engine",
        [
            sys.executable, "-m", "progrouter", "engine", "--port", str(engine_port),
            "--model-name", MODEL, "--data-parallel-size", "2", "--num-blocks", "8192",
            "--max-num-seqs", "256", "--time-scale", str(time_scale), "--log-level", "warning",
        ],
    )  # fmt: skip
    router = spawn(
        "router",
        [
            sys.executable, "-m", "progrouter", "serve",
            "--worker-urls", f"http://127.0.0.1:{engine_port}", "--intra-node-data-parallel-size", "2",
            "--port", str(router_port), "--prometheus-port", str(metrics_port), "--log-level", "warning",
            "--health-check-interval-secs", "5",
            "--enable-program-scheduling", "--program-scheduling-config-json", json.dumps(program),
        ],
    )  # fmt: skip
    return Fleet(
        engine, router, f"http://127.0.0.1:{router_port}", f"http://127.0.0.1:{metrics_port}/metrics"
    )


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# ------------------------------------------------------------------------------------------------ the load
@dataclass
class Window:
    """What happened since the last row."""

    latencies: list[float] = field(default_factory=list)
    liveness: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)

    def take(self) -> Window:
        taken = Window(self.latencies, self.liveness, self.statuses)
        self.latencies, self.liveness, self.statuses = [], [], Counter()
        return taken


@dataclass
class Totals:
    programs: int = 0  # distinct Programs so far
    requests: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    retry_after: int = 0


def body(program: str | None, turn: int, stream: bool) -> dict[str, Any]:
    words = " ".join(f"w{(turn * 7 + i) % 997}" for i in range(PROMPT_WORDS + 10 * turn))
    out: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"{program or 'native'} {words}"}],
        "max_tokens": MAX_TOKENS,
    }
    if program is not None:
        out["vllm_xargs"] = {"agentic_context": json.dumps({"program_id": program})}
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


async def request(
    session: aiohttp.ClientSession, url: str, payload: dict[str, Any], window: Window, totals: Totals
) -> None:
    start = time.perf_counter()
    try:
        async with session.post(url + "/v1/chat/completions", json=payload) as r:
            await r.read()
            status = str(r.status)
            if r.status == 429 and "Retry-After" in r.headers:
                totals.retry_after += 1
    except (aiohttp.ClientError, TimeoutError) as exc:
        status = type(exc).__name__
    window.latencies.append(time.perf_counter() - start)
    window.statuses[status] += 1
    totals.statuses[status] += 1
    totals.requests += 1


def probe_forever(url: str) -> None:
    """The lag probe, in its own process so the load generator's busy loop does not count: one
    ``GET /liveness`` every 50 ms on a kept-alive connection, its latency in ms on stdout."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
    while True:
        start = time.perf_counter()
        try:
            conn.request("GET", "/liveness")
            conn.getresponse().read()
        except (OSError, http.client.HTTPException):
            conn.close()
        print(f"{(time.perf_counter() - start) * 1e3:.3f}", flush=True)
        time.sleep(0.05)


async def probe_liveness(url: str, window: Window) -> None:
    """Run ``probe_forever`` in a subprocess and collect its latencies (in seconds) into the window."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--probe", url, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        while line := await proc.stdout.readline():
            window.liveness.append(float(line) / 1e3)
    finally:
        proc.kill()
        await proc.wait()


def p99_ms(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] * 1e3 if values else math.nan
    return statistics.quantiles(values, n=100, method="inclusive")[98] * 1e3


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, list[Any]]:
    async with session.get(url) as r:
        text = await r.text()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


# ------------------------------------------------------------------------------------------------ reporting
@dataclass
class Row:
    seconds: float
    programs: int
    requests: int
    rss: float
    fds: int
    lag_p99: float
    req_p99: float
    statuses: str

    def line(self) -> str:
        return (
            f"{self.seconds:>7.0f} {self.programs:>9} {self.requests:>9} {self.rss:>8.1f} {self.fds:>5}"
            f" {self.lag_p99:>9.1f} {self.req_p99:>9.1f}  {self.statuses}"
        )


HEADER = (
    f"{'t s':>7} {'programs':>9} {'requests':>9} {'RSS MB':>8} {'fds':>5} {'lag p99':>9} {'req p99':>9}"
    "  statuses"
)


async def report_rows(
    fleet: Fleet, window: Window, totals: Totals, started: float, interval: float, rows: list[Row]
) -> None:
    print(HEADER, flush=True)
    while True:
        await asyncio.sleep(interval)
        w = window.take()
        row = Row(
            time.monotonic() - started,
            totals.programs,
            totals.requests,
            rss_mb(fleet.router.pid),
            open_fds(fleet.router.pid),
            p99_ms(w.liveness),
            p99_ms(w.latencies),
            " ".join(f"{k}:{v}" for k, v in sorted(w.statuses.items())),
        )
        rows.append(row)
        print(row.line(), flush=True)


# ------------------------------------------------------------------------------------------------ modes
async def distinct(
    session: aiohttp.ClientSession, url: str, args: argparse.Namespace, window: Window, totals: Totals
) -> None:
    ids = itertools.count()

    async def agent() -> None:
        while (i := next(ids)) < args.programs:
            for turn in range(args.turns):
                await request(session, url, body(f"soak-{i}", turn, (i + turn) % 2 == 0), window, totals)
            totals.programs += 1

    await asyncio.gather(*(agent() for _ in range(args.concurrency)))


async def steady(
    session: aiohttp.ClientSession, url: str, args: argparse.Namespace, window: Window, totals: Totals
) -> None:
    """Returning Programs (a working set of 1,000), new Programs, and native requests, for ``--minutes``."""
    end = time.monotonic() + args.minutes * 60
    fresh = itertools.count()
    seen: set[str] = set()  # the working set's ids sent so far (at most 1,000)

    async def agent(n: int) -> None:
        for k in itertools.count():
            if time.monotonic() >= end:
                return
            if k % 5 == 4:
                await request(session, url, body(None, k % 3, k % 2 == 0), window, totals)
                continue
            program = f"steady-{(n * 131 + k) % 1000}" if k % 3 else f"new-{next(fresh)}"
            if program not in seen:
                totals.programs += 1
                if program.startswith("steady-"):
                    seen.add(program)
            for turn in range(args.turns):
                await request(session, url, body(program, turn, (k + turn) % 2 == 0), window, totals)

    await asyncio.gather(*(agent(n) for n in range(args.concurrency)))


def comfortable_programs(config: dict[str, Any], ranks: int = 2) -> int:
    """Programs the configured capacity holds at once (their first turn's size plus the decode buffer)."""
    per_program = PROMPT_WORDS + 1 + MAX_TOKENS + config.get("decode_buffer_tokens", 100)
    return max(1, ranks * int(config["token_capacity_per_dp_rank"]) // int(per_program))


async def overload(
    session: aiohttp.ClientSession, url: str, args: argparse.Namespace, window: Window, totals: Totals
) -> None:
    concurrent = args.overload_factor * comfortable_programs(args.program)
    print(
        f"overload: {concurrent} concurrent Programs, comfortable load {comfortable_programs(args.program)}",
        flush=True,
    )

    async def agent(i: int) -> None:
        for turn in range(args.turns):
            await request(session, url, body(f"over-{i}", turn, (i + turn) % 2 == 0), window, totals)
            await asyncio.sleep(0.2)
        totals.programs += 1

    await asyncio.gather(*(agent(i) for i in range(concurrent)))


async def watch_overload(session: aiohttp.ClientSession, fleet: Fleet, peaks: dict[str, float]) -> None:
    """Peaks over the run: Programs active on one Rank, retained requests, RSS."""
    while True:
        with_metrics = await scrape(session, fleet.metrics_url)
        active = [s.value for s in with_metrics.get(PREFIX + "rank_active_programs", [])]
        peaks["active_per_rank"] = max(peaks.get("active_per_rank", 0.0), *active, 0.0)
        async with session.get(fleet.url + "/scheduling/diagnostics") as r:
            retained = float((await r.json())["retained_requests"])
        peaks["retained_requests"] = max(peaks.get("retained_requests", 0.0), retained)
        peaks["rss_mb"] = max(peaks.get("rss_mb", 0.0), rss_mb(fleet.router.pid))
        await asyncio.sleep(0.5)


def queue_wait_summary(samples: list[Any]) -> str:
    """Mean of the queue-wait summary over all targets, and the largest per-target p99 (its 0.99 quantile,
    over the last 1,024 waits of each target)."""
    count = sum(s.value for s in samples if s.name.endswith("_count"))
    total = sum(s.value for s in samples if s.name.endswith("_sum"))
    p99 = max((s.value for s in samples if s.labels.get("quantile") == "0.99"), default=math.nan)
    if not count:
        return "no samples"
    return f"{int(count)} waits, mean {total / count:.2f} s, p99 (largest over Ranks) {p99:.2f} s"


# ------------------------------------------------------------------------------------------------ main
async def run(args: argparse.Namespace) -> None:
    fleet = start_fleet(args.program, args.time_scale, args.log_dir)
    window, totals = Window(), Totals()
    rows: list[Row] = []
    peaks: dict[str, float] = {}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await wait_ready(session, fleet.url + "/liveness")
            await wait_ready(session, fleet.url + "/readiness")
            started = time.monotonic()
            print(
                f"soak mode={args.mode} router pid {fleet.router.pid},"
                f" RSS at start {rss_mb(fleet.router.pid):.1f} MB, fds {open_fds(fleet.router.pid)};"
                f" config {json.dumps(args.program)}",
                flush=True,
            )
            background = [
                asyncio.create_task(probe_liveness(fleet.url, window)),
                asyncio.create_task(report_rows(fleet, window, totals, started, args.interval, rows)),
            ]
            if args.mode == "overload":
                background.append(asyncio.create_task(watch_overload(session, fleet, peaks)))
            try:
                await {"distinct": distinct, "steady": steady, "overload": overload}[args.mode](
                    session, fleet.url, args, window, totals
                )
            finally:
                for task in background:
                    task.cancel()
                await asyncio.gather(*background, return_exceptions=True)
            metrics = await scrape(session, fleet.metrics_url)
            summarize(args, rows, totals, peaks, metrics, time.monotonic() - started)
    finally:
        fleet.stop()


def summarize(
    args: argparse.Namespace,
    rows: list[Row],
    totals: Totals,
    peaks: dict[str, float],
    metrics: dict[str, list[Any]],
    seconds: float,
) -> None:
    print(f"\n{totals.requests} requests, {totals.programs} distinct Programs in {seconds:.0f} s;"
          f" statuses {dict(sorted(totals.statuses.items()))}")  # fmt: skip
    if not rows:
        return
    warm = next((r for r in rows if r.programs >= args.warmup_programs), rows[0])
    last = rows[-1]
    if args.mode != "overload" and last.programs > warm.programs:
        growth = (last.rss - warm.rss) / (last.programs - warm.programs) * 100_000
        print(
            f"RSS {rows[0].rss:.1f} MB -> {warm.rss:.1f} MB after warm-up ({warm.programs} Programs)"
            f" -> {last.rss:.1f} MB: {growth:.1f} MB per 100,000 distinct Programs after warm-up"
            " (target < 20)"
        )
        # The bounds fill at different times (the paused cap, then the generation fence of as many released
        # Programs): the second half of the run shows the growth once all of them are full.
        half = next(r for r in rows if r.programs >= last.programs // 2)
        if last.programs > half.programs:
            late = (last.rss - half.rss) / (last.programs - half.programs) * 100_000
            print(
                f"second half: {half.rss:.1f} MB at {half.programs} Programs -> {last.rss:.1f} MB:"
                f" {late:.1f} MB per 100,000 distinct Programs"
            )
    fds = [r.fds for r in rows]
    lag = [r.lag_p99 for r in rows if not math.isnan(r.lag_p99)]
    req = [r.req_p99 for r in rows if not math.isnan(r.req_p99)]
    print(f"fds min/max {min(fds)}/{max(fds)}")
    if lag and req:
        third = max(1, len(req) // 3)
        print(
            f"liveness p99 per row: median {statistics.median(lag):.1f} ms, max {max(lag):.1f} ms;"
            f" request p99 first third {statistics.median(req[:third]):.1f} ms,"
            f" last third {statistics.median(req[-third:]):.1f} ms"
        )
    if args.mode == "overload":
        print(
            f"429s {totals.statuses.get('429', 0)} (with Retry-After {totals.retry_after});"
            f" queue wait: {queue_wait_summary(metrics.get(PREFIX + 'queue_wait_seconds', []))};"
            f" peak Programs active on one Rank {peaks.get('active_per_rank', 0):.0f};"
            f" peak retained requests {peaks.get('retained_requests', 0):.0f};"
            f" peak RSS {peaks.get('rss_mb', 0):.1f} MB"
        )
        refused = {
            s.labels["reason"]: int(s.value)
            for s in metrics.get("progrouter_program_rejections", [])
            if s.name.endswith("_total") and s.value
        }
        print(f"progrouter_program_rejections_total by reason: {refused}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["distinct", "steady", "overload"], default="distinct")
    parser.add_argument("--programs", type=int, default=100_000, help="distinct mode: Programs in all")
    parser.add_argument("--minutes", type=float, default=30.0, help="steady mode: how long")
    parser.add_argument("--turns", type=int, default=1, help="requests per Program (overload: 8)")
    parser.add_argument("--concurrency", type=int, default=32, help="agents at a time (not overload)")
    parser.add_argument("--overload-factor", type=int, default=10)
    parser.add_argument("--time-scale", type=float, default=1000.0, help="the engine's time scale")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds per printed row")
    parser.add_argument("--warmup-programs", type=int, default=10_000)
    parser.add_argument("--request-timeout", type=float, default=120.0)
    parser.add_argument("--program-config", default=None, help="JSON merged over the mode's config")
    parser.add_argument("--log-dir", default="bench-reports/soak")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe is not None:
        probe_forever(args.probe)
        return 0
    base = OVERLOAD_CONFIG if args.mode == "overload" else DISTINCT_CONFIG
    args.program = {**base, **json.loads(args.program_config or "{}")}
    if args.mode == "overload" and args.turns == 1:
        args.turns = 8
    import uvloop

    uvloop.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
