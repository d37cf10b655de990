"""Router overhead: router CPU per request, added latency and requests/s, progrouter beside upstream.

The worker and each router run in their own process (uvloop), the load generator in this one. Both routers
get the same flags (round_robin, one trivial loopback worker, Program scheduling on) and the same loads:
plain chat completions and Program ones (an ``agentic_context``), at concurrency 1 and 32. Each load also
goes straight to the worker, so "added p50" is the router's median minus the direct one. "CPU µs/req" is the
router's process-tree CPU time (user+system, from /proc) over the requests it proxied: wall time on a shared
machine says little, CPU time says what the router costs. The upstream wheel is measured when
``.venv-upstream/bin/vllm-router`` exists (``make upstream``). The "aiohttp floor" row is the trivial worker's
own CPU per request under the same loads (an aiohttp server with one handler and no proxying): what any
router served by aiohttp spends before doing anything. "@1" and "@32" split the CPU per request (and its ratio
to upstream's) by concurrency. ``--burn N`` runs N CPU-burning processes for the whole bench (the figures
"under load"); ``--gaps 0,2,10`` instead prints CPU per plain request at concurrency 1 with the client pausing
between requests (the cost of a request that starts cold, after the router slept while others ran).

``--context-chars N`` pads every request with N characters of context (400000 ≈ the 100k-token call of a
coding agent), where the per-byte work of the request path shows.

``--profile`` then runs progrouter once more with a sampling profiler on CPU time (``CpuSampler``), switched
on for each load's measured part alone (SIGUSR1 starts and ends a segment), and prints per load: a summary
by layer (``LAYERS``: HTTP server, worker hop, scheduler core, metrics …), the own CPU per request by
component (a progrouter module, aiohttp, prometheus_client …) and the top functions by
cumulative CPU per request: each function's share of the samples times the CPU per request measured from
/proc over the same segment. Samples come one per kernel tick of CPU (4 ms here), so use ``--requests``
≥ 1500 for shares good to a percent or two.

``--paired OTHER_SRC`` compares this tree with another one (its ``src`` directory) on a shared machine, where
single runs move by ±25 %: the other tree's router, this tree's and upstream's run at once against one worker,
and each of ``--chunks`` chunks sends ``--requests`` requests at concurrency 1 and as many at 32 of each load
through the three in turn (the order rotating from chunk to chunk), router CPU from /proc around each. It
prints per load each router's median CPU µs per request, the median and interquartile range of this/other per
chunk, the ratio of the sums, and each tree's CPU over upstream's in the same chunks (median).

    .venv/bin/python bench/overhead.py [--requests 4000] [--repeat 3] [--profile [OUT]] [--context-chars N]
    .venv/bin/python bench/overhead.py --paired ../main/src [--requests 400] [--chunks 30]
    .venv/bin/python bench/overhead.py --gaps 0,2,10 [--requests 600]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import aiohttp
from aiohttp import web

from _loopback import cpu_burners, loadavg, run_worker, stop
from _loopback import free_port as _free_port
from _loopback import tree_cpu as _tree_cpu
from _loopback import wait_ready as _wait_ready

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = ROOT / ".venv-upstream" / "bin" / "vllm-router"
_MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]
PROGRAMS = 8  # distinct Programs the Program load cycles through
FLOOR = "aiohttp floor"


def _request(extra: dict[str, object], context_chars: int) -> bytes:
    """A chat completion; ``context_chars`` of filler before the question stand for an agent's context
    (400,000 characters ≈ 100k tokens, the size of a coding agent's median call)."""
    messages = _MESSAGES
    if context_chars:
        filler = ("lorem ipsum dolor sit amet " * (context_chars // 27 + 1))[:context_chars]
        messages = [_MESSAGES[0], {"role": "user", "content": filler + "\nSay hi."}]
    body = {"model": "bench", "messages": messages, "max_tokens": 4, "stream": False, **extra}
    return json.dumps(body).encode()


def make_loads(context_chars: int) -> dict[str, list[bytes]]:
    """Each load's bodies, sent in turn: plain requests, and Program ones (an ``agentic_context`` naming
    one of ``PROGRAMS`` Programs)."""
    programs = []
    for i in range(PROGRAMS):
        context = json.dumps({"task_id": f"task-{i}", "agent_id": "lead"})
        programs.append(_request({"vllm_xargs": {"agentic_context": context}}, context_chars))
    return {"plain": [_request({}, context_chars)], "program": programs}


ANSWER = (
    b'{"id": "cmpl-1", "object": "chat.completion", "model": "bench", "choices": [{"index": 0,'
    b' "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],'
    b' "usage": {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}}'
)
LOADS = make_loads(0)  # --context-chars replaces them


def serve_worker(port: int) -> None:
    """The trivial worker: a fixed chat completion, and /health."""

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    run_worker(port, chat)


Frame = tuple[str, int, str]  # file, first line, qualified name


class CpuSampler:
    """A statistical profiler on CPU time: SIGPROF fires per slice of process CPU (user + system, a kernel
    tick here, 4 ms) and the handler counts the Python stack it interrupts. Time in C code — a system call,
    the event loop's own work — is charged to the Python function that runs next, as the handler runs there.
    (cProfile would not do: with a CPU clock every call pays a ~4 µs system call, and with a wall clock a
    loaded machine's preemptions land on whichever call is running.)"""

    def __init__(self) -> None:
        self.stacks: dict[tuple[Frame, ...], int] = {}

    def start(self) -> None:
        signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, 0.001, 0.001)

    def stop(self, path: str) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        with open(f"{path}.tmp", "w") as out:
            json.dump([[list(stack), count] for stack, count in self.stacks.items()], out)
        os.replace(f"{path}.tmp", path)  # whole when the bench sees it
        self.stacks = {}

    def _sample(self, _signum: int, frame: FrameType | None) -> None:
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append((code.co_filename, code.co_firstlineno, code.co_qualname))
            frame = frame.f_back
        key = tuple(stack)
        self.stacks[key] = self.stacks.get(key, 0) + 1


def serve_profiled(out: str, argv: list[str]) -> None:
    """progrouter's CLI with a ``CpuSampler`` switched by SIGUSR1: the first signal starts a segment, the
    next one writes it to ``<out>.<n>`` (n = 0, 1, …), so each load is profiled alone, without warm-up."""
    from progrouter.cli import main as cli_main

    sampler = CpuSampler()
    segments = 0

    def _toggle(_signum: int, _frame: object) -> None:
        nonlocal segments
        if segments % 2 == 0:
            sampler.start()
        else:
            sampler.stop(f"{out}.{segments // 2}")
        segments += 1

    signal.signal(signal.SIGUSR1, _toggle)
    cli_main(argv)


@dataclass
class Cell:
    """One load against one target."""

    rps: float
    p50_ms: float


async def _load(session: aiohttp.ClientSession, url: str, load: str, requests: int, concurrency: int) -> Cell:
    latencies: list[float] = []
    sent = 0
    headers = {"Content-Type": "application/json"}
    bodies = LOADS[load]

    async def one_client() -> None:
        nonlocal sent
        while sent < requests:
            body = bodies[sent % len(bodies)]
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
class Segment:
    """One load's profile: the samples' file, the requests it covers, the process CPU per request."""

    path: str
    requests: int
    cpu_us: float  # per request, from /proc, the sampler's own cost included


@dataclass
class Row:
    """One router and one load: CPU per request, added p50 at concurrency 1, req/s at concurrency 32."""

    router: str
    load: str
    cpu_us: float
    sys_us: float  # the system part of cpu_us: loopback TCP is charged to the sender as system time
    added_p50_ms: float
    rps_32: float
    cpu_1_us: float  # the concurrency-1 part alone
    cpu_32_us: float  # the concurrency-32 part alone


def router_argv(router: str, worker_port: int, port: int) -> list[str]:
    """The command line of ``router`` ("upstream", or progrouter's ``serve`` arguments)."""
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
) -> tuple[list[Row], dict[str, Cell], dict[str, Segment]]:
    """Start ``router``, run both loads through it (and straight to the worker), return its rows; with
    ``profile`` (a path prefix) progrouter runs sampled, one segment per load's measured part."""
    port = _free_port()
    argv = router_argv(router, worker_port, port)
    if router == "upstream":
        cmd = argv
    elif profile is not None:
        cmd = [sys.executable, __file__, "--serve-profiled", profile, "--", *argv]
    else:
        cmd = [sys.executable, "-m", "progrouter", *argv]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL)
    direct = f"http://127.0.0.1:{worker_port}/v1/chat/completions"
    routed = f"http://127.0.0.1:{port}/v1/chat/completions"
    rows: list[Row] = []
    directs: dict[str, Cell] = {}
    segments: dict[str, Segment] = {}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
            await _wait_ready(session, f"http://127.0.0.1:{port}/liveness")
            for load in LOADS:
                await _load(session, routed, load, min(500, requests), 1)  # warm-up
                if profile is not None:
                    proc.send_signal(signal.SIGUSR1)  # start this load's segment
                cpu0 = _tree_cpu(proc.pid)
                one = await _load(session, routed, load, requests, 1)
                cpu_mid = sum(_tree_cpu(proc.pid))
                many = await _load(session, routed, load, requests, 32)
                cpu1 = _tree_cpu(proc.pid)
                per_request = [
                    (after - before) / (2 * requests) * 1e6 for after, before in zip(cpu1, cpu0, strict=True)
                ]
                if profile is not None:
                    proc.send_signal(signal.SIGUSR1)  # end it: the router writes <profile>.<n>
                    path = f"{profile}.{len(segments)}"
                    await _wait_for_file(path)
                    segments[load] = Segment(path, 2 * requests, sum(per_request))
                directs[load] = await _load(session, direct, load, requests, 1)
                rows.append(
                    Row(
                        router,
                        load,
                        sum(per_request),
                        per_request[1],
                        one.p50_ms - directs[load].p50_ms,
                        many.rps,
                        (cpu_mid - sum(cpu0)) / requests * 1e6,
                        (sum(cpu1) - cpu_mid) / requests * 1e6,
                    )
                )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    return rows, directs, segments


async def _wait_for_file(path: str) -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the profiled router did not write {path}")
        await asyncio.sleep(0.05)


async def measure_floor(worker_pid: int, worker_port: int, requests: int) -> list[Row]:
    """The trivial worker's own CPU per request under each load, driven as the routers are."""
    url = f"http://127.0.0.1:{worker_port}/v1/chat/completions"
    rows = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        for load in LOADS:
            cpu0 = _tree_cpu(worker_pid)
            await _load(session, url, load, requests, 1)
            cpu_mid = sum(_tree_cpu(worker_pid))
            many = await _load(session, url, load, requests, 32)
            cpu1 = _tree_cpu(worker_pid)
            per_request = [
                (after - before) / (2 * requests) * 1e6 for after, before in zip(cpu1, cpu0, strict=True)
            ]
            cpu_1, cpu_32 = (cpu_mid - sum(cpu0)) / requests * 1e6, (sum(cpu1) - cpu_mid) / requests * 1e6
            rows.append(Row(FLOOR, load, sum(per_request), per_request[1], 0.0, many.rps, cpu_1, cpu_32))
    return rows


def _paired_commands(other_src: str, worker_port: int) -> dict[str, tuple[list[str], dict[str, str], str]]:
    """Per router of ``--paired``: its command, environment and chat completions URL."""
    here = str(ROOT / "src")
    routers = ["other", "this", *(["upstream"] if UPSTREAM.exists() else [])]
    commands = {}
    for router in routers:
        port = _free_port()
        argv = router_argv("upstream" if router == "upstream" else "progrouter", worker_port, port)
        src = other_src if router == "other" else here
        cmd = argv if router == "upstream" else [sys.executable, "-m", "progrouter", *argv]
        env = {**os.environ, "PYTHONPATH": src, "PYTHONUNBUFFERED": "1"}
        commands[router] = (cmd, env, f"http://127.0.0.1:{port}/v1/chat/completions")
    return commands


async def gaps(requests: int, pauses_ms: list[float]) -> None:
    """CPU per plain request at concurrency 1 with the client pausing between requests (``--gaps``): the
    router then sleeps between requests while other processes run, and each request starts cold. Printed
    for progrouter, upstream and the trivial worker (the aiohttp floor), two rounds, pauses in turn."""
    worker_port = _free_port()
    worker = subprocess.Popen([sys.executable, __file__, "--serve-worker", str(worker_port)])
    procs: dict[str, subprocess.Popen[bytes]] = {}
    urls = {FLOOR: f"http://127.0.0.1:{worker_port}/v1/chat/completions"}
    try:
        async with aiohttp.ClientSession() as session:
            await _wait_ready(session, f"http://127.0.0.1:{worker_port}/health")
            for router in ["progrouter", *(["upstream"] if UPSTREAM.exists() else [])]:
                port = _free_port()
                argv = router_argv(router, worker_port, port)
                cmd = argv if router == "upstream" else [sys.executable, "-m", "progrouter", *argv]
                procs[router] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
                urls[router] = f"http://127.0.0.1:{port}/v1/chat/completions"
                await _wait_ready(session, f"http://127.0.0.1:{port}/liveness")
                await _load(session, urls[router], "plain", 300, 1)  # warm-up
            pids = {**{r: p.pid for r, p in procs.items()}, FLOOR: worker.pid}
            print(
                "CPU µs per plain request at c=1, the client pausing between requests; "
                f"/proc/loadavg {loadavg()}"
            )
            for _round in range(2):
                for pause in pauses_ms:
                    cells = []
                    for router, url in urls.items():
                        before = sum(_tree_cpu(pids[router]))
                        for _ in range(requests):
                            async with session.post(url, data=LOADS["plain"][0], headers=_JSON) as resp:
                                await resp.read()
                            time.sleep(pause / 1e3)  # blocking: nothing of the client runs meanwhile
                        cells.append(
                            f"{router} {(sum(_tree_cpu(pids[router])) - before) / requests * 1e6:.0f}"
                        )
                    print(f"  pause {pause:>4g} ms: {', '.join(cells)}")
    finally:
        stop(procs.values(), worker)


_JSON = {"Content-Type": "application/json"}


async def paired(other_src: str, requests: int, chunks: int) -> None:
    """This tree's router against another tree's and upstream's, chunk by chunk (see the docstring)."""
    worker_port = _free_port()
    worker = subprocess.Popen([sys.executable, __file__, "--serve-worker", str(worker_port)])
    procs: dict[str, subprocess.Popen[bytes]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
            await _wait_ready(session, f"http://127.0.0.1:{worker_port}/health")
            commands = _paired_commands(other_src, worker_port)
            for router, (cmd, env, _url) in commands.items():
                procs[router] = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
            for _cmd, _env, url in commands.values():
                await _wait_ready(session, url.replace("/v1/chat/completions", "/liveness"))
                for load in LOADS:  # warm-up
                    await _load(session, url, load, 600, 1)
                    await _load(session, url, load, 600, 32)
            names = list(commands)
            for k in range(chunks):
                order = names[k % len(names) :] + names[: k % len(names)]
                for load in LOADS:
                    for router in order if k % 2 == 0 else order[::-1]:
                        url = commands[router][2]
                        before = sum(_tree_cpu(procs[router].pid))
                        await _load(session, url, load, requests, 1)
                        await _load(session, url, load, requests, 32)
                        spent = sum(_tree_cpu(procs[router].pid)) - before
                        cpu.setdefault((router, load), []).append(spent / (2 * requests) * 1e6)
    finally:
        stop(procs.values(), worker)
    print(
        f"paired: this tree ({ROOT}) against {other_src}, {chunks} chunks of {requests} requests at"
        f" concurrency 1 and {requests} at 32 per load and router; load average {os.getloadavg()[0]:.1f}"
    )
    for load in LOADS:
        other, this = cpu[("other", load)], cpu[("this", load)]
        q1, median, q3 = statistics.quantiles([b / a for a, b in zip(other, this, strict=True)], n=4)
        line = (
            f"{load:>8}: CPU µs/req median other {statistics.median(other):.0f}, this"
            f" {statistics.median(this):.0f}; this/other per chunk {median:.3f} (IQR {q1:.3f}–{q3:.3f}),"
            f" sums {sum(this) / sum(other):.3f}"
        )
        if ("upstream", load) in cpu:
            theirs = cpu[("upstream", load)]
            times = {
                side: statistics.median(a / b for a, b in zip(cpu[(side, load)], theirs, strict=True))
                for side in ("other", "this")
            }
            line += (
                f"; upstream {statistics.median(theirs):.0f}, × upstream per chunk: other"
                f" {times['other']:.2f}, this {times['this']:.2f}"
            )
        print(line)


def component(filename: str) -> str:
    """What a profiled function belongs to: a progrouter module, a third-party package or the stdlib."""
    if "/progrouter/" in filename:
        return filename.rsplit("/progrouter/", 1)[1].removesuffix(".py")
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/", 1)[0]
    if filename == "<string>":
        return "generated code"
    if "/asyncio/" in filename:
        return "asyncio"
    return "stdlib"


# Components by the layer they belong to, for the one-line summary (a prefix of the component's name).
LAYERS = (
    ("HTTP server", ("aiohttp", "yarl", "multidict", "aiosignal", "frozenlist", "server/edge/connection",
                     "server/edge/middleware", "server/front", "server/edge/exchange")),
    ("worker hop", ("server/hop/worker_client",)),
    ("Program identity, usage, estimate", ("agents/identity", "agents/usage", "agents/token_estimator")),
    ("scheduler core", ("program/",)),
    ("metrics", ("prometheus_client", "server/telemetry/metrics", "server/telemetry/local_metrics",
                 "server/gate/program_metrics", "server/telemetry/event_feed")),
    ("event loop, stdlib", ("asyncio", "stdlib")),
)  # fmt: skip
OTHER_LAYER = "the rest of progrouter"


def layer(name: str) -> str:
    """The first layer of ``LAYERS`` whose prefixes ``name`` starts with."""
    return next((title for title, prefixes in LAYERS if name.startswith(prefixes)), OTHER_LAYER)


def breakdown(segment: Segment, top: int) -> list[str]:
    """Lines: own CPU per request by component, then the top functions by cumulative CPU per request (each
    sample's share of the segment's measured process CPU)."""
    with open(segment.path) as f:
        stacks: list[tuple[list[Frame], int]] = [([tuple(fr) for fr in st], n) for st, n in json.load(f)]
    samples = sum(count for _, count in stacks)
    if samples == 0:
        return ["  (no samples: too few requests)"]
    us_per_sample = segment.cpu_us / samples
    own: dict[str, int] = {}
    inclusive: dict[Frame, int] = {}
    for stack, count in stacks:
        # Generated code (a dataclass's __init__, __eq__, __hash__) is charged to the module that called it.
        name = component(next((f[0] for f in stack if f[0] != "<string>"), stack[0][0]))
        own[name] = own.get(name, 0) + count
        for frame in set(stack):
            inclusive[frame] = inclusive.get(frame, 0) + count
    layers: dict[str, int] = {}
    for name, count in own.items():
        layers[layer(name)] = layers.get(layer(name), 0) + count
    summary = ", ".join(
        f"{title} {count * us_per_sample:,.0f} ({count / samples:.0%})"
        for title, count in sorted(layers.items(), key=lambda kv: -kv[1])
    )
    lines = [
        f"  {samples} samples of CPU time; {segment.cpu_us:,.0f} µs/request with the sampler on",
        f"  by layer, µs/req: {summary}",
        f"  {'own CPU by component':<44} {'µs/req':>8} {'share':>6}",
    ]
    for name, count in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {name:<44} {count * us_per_sample:>8.1f} {count / samples:>6.1%}")
    lines.append(f"  {'top functions by cumulative CPU':<70} {'µs/req':>8} {'share':>6}")
    ranked = sorted(inclusive.items(), key=lambda kv: -kv[1])
    shown = [(frame, count) for frame, count in ranked if count < samples][:top]  # not the loop's runner
    for (filename, line, name), count in shown:
        label = f"{name} ({component(filename)}:{line})"
        lines.append(f"  {label[:70]:<70} {count * us_per_sample:>8.1f} {count / samples:>6.1%}")
    return lines


def print_breakdowns(segments: dict[str, Segment], rows: list[Row], top: int) -> None:
    """Per load: progrouter's profile beside the unprofiled CPU of both routers in this run."""
    for load, segment in segments.items():
        measured = ", ".join(
            f"{r.router} {r.cpu_us:,.0f}" for r in rows if r.load == load and r.router != FLOOR
        )
        print(f"\nprogrouter, {load} load, {segment.requests} requests (unprofiled µs/req here: {measured})")
        print("\n".join(breakdown(segment, top)))


_RATIOS: tuple[tuple[Callable[[Row], float], int], ...] = (
    (lambda r: r.cpu_us, 10),
    (lambda r: r.cpu_1_us, 5),
    (lambda r: r.cpu_32_us, 5),
)


def _ratio(pairs: list[tuple[Row, Row]], part: Callable[[Row], float], width: int) -> str:
    """The median over runs of progrouter's ``part`` over upstream's in the same run."""
    if not pairs:
        return f"{'-':>{width}}"
    return f"{statistics.median(part(mine) / part(theirs) for mine, theirs in pairs):>{width}.2f}"


def summarize(runs: list[list[Row]]) -> None:
    """Min and median over the repeats, per router and load; "× upstream" is the median of each run's own
    CPU ratio (a shared machine inflates both routers' figures alike within one run, not across runs)."""
    keys = [(r.router, r.load) for r in runs[0]]
    header = (
        f"{'router':>13} {'load':>8} | {'CPU µs/req min':>14} {'median':>7} {'(sys)':>6} {'@1':>5} {'@32':>5}"
        f" {'× upstream':>10} {'@1':>5} {'@32':>5}"
        f" | {'added p50 ms min':>16} {'median':>7} | {'req/s@32 max':>12} {'median':>7}"
    )
    print(header)
    print("-" * len(header))
    for router, load in keys:
        cells = [r for run in runs for r in run if (r.router, r.load) == (router, load)]
        cpu = [c.cpu_us for c in cells]
        p50 = [c.added_p50_ms for c in cells]
        rps = [c.rps_32 for c in cells]
        pairs = [
            (mine, theirs)
            for run in runs
            for mine in run
            for theirs in run
            if (mine.router, mine.load) == (router, load)
            and (theirs.router, theirs.load) == ("upstream", load)
        ]

        ours = router != "upstream"
        shown = [_ratio(pairs if ours else [], part, width) for part, width in _RATIOS]

        print(
            f"{router:>13} {load:>8} | {min(cpu):>14.0f} {statistics.median(cpu):>7.0f}"
            f" {statistics.median(c.sys_us for c in cells):>6.0f}"
            f" {statistics.median(c.cpu_1_us for c in cells):>5.0f}"
            f" {statistics.median(c.cpu_32_us for c in cells):>5.0f}"
            f" {' '.join(shown)}"
            f" | {min(p50):>16.3f} {statistics.median(p50):>7.3f}"
            f" | {max(rps):>12.0f} {statistics.median(rps):>7.0f}"
        )


async def bench(requests: int, repeat: int, profile: str | None, burn: int) -> None:
    with cpu_burners(burn):
        await _bench(requests, repeat, profile, burn)


async def _bench(requests: int, repeat: int, profile: str | None, burn: int) -> None:
    worker_port = _free_port()
    worker = subprocess.Popen([sys.executable, __file__, "--serve-worker", str(worker_port)])
    routers = ["progrouter", *(["upstream"] if UPSTREAM.exists() else [])]
    runs: list[list[Row]] = []
    segments: dict[str, Segment] = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            async with aiohttp.ClientSession() as session:
                await _wait_ready(session, f"http://127.0.0.1:{worker_port}/health")
            for _ in range(repeat):
                run: list[Row] = []
                for router in routers:
                    run.extend((await measure(router, worker_port, requests, None))[0])
                run.extend(await measure_floor(worker.pid, worker_port, requests))
                runs.append(run)
            if profile is not None:
                out = profile or os.path.join(tmp, "router.prof")
                segments = (await measure("progrouter", worker_port, requests, out))[2]
        finally:
            worker.terminate()
            worker.wait(timeout=30)
        print(
            f"router overhead, round_robin, 1 loopback worker, 4-token completion,"
            f" {len(LOADS['plain'][0]):,}-byte request bodies, {requests} requests per"
            f" cell, {repeat} runs, {os.cpu_count()} CPUs, {burn} CPU burners, load average"
            f" {os.getloadavg()[0]:.1f} (/proc/loadavg: {loadavg()})"
        )
        if not UPSTREAM.exists():
            print("(upstream not measured: `make upstream` installs .venv-upstream)")
        summarize(runs)
        print_breakdowns(segments, runs[-1], 25)


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
        help="after the table, progrouter again under a CPU sampler, one profile per load: print where"
        " its CPU per request goes; keep the samples as OUT.0 (plain), OUT.1 (Program) if given",
    )
    parser.add_argument(
        "--paired", metavar="OTHER_SRC", help="compare with another tree's src, chunk by chunk (see above)"
    )
    parser.add_argument("--chunks", type=int, default=30, help="with --paired: how many chunks")
    parser.add_argument(
        "--gaps",
        metavar="MS,MS,...",
        help="instead of the table: CPU per plain request at c=1 with the client pausing MS between requests",
    )
    parser.add_argument(
        "--burn",
        type=int,
        default=0,
        metavar="N",
        help="run N CPU-burning processes (one core each) for the whole bench: the figures under load",
    )
    parser.add_argument(
        "--context-chars",
        type=int,
        default=0,
        metavar="N",
        help="pad each request with N characters of context (400000 ≈ a coding agent's 100k-token call)",
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

    global LOADS
    LOADS = make_loads(args.context_chars)
    if args.gaps is not None:
        uvloop.run(gaps(args.requests, [float(g) for g in args.gaps.split(",")]))
    elif args.paired is not None:
        uvloop.run(paired(args.paired, args.requests, args.chunks))
    else:
        uvloop.run(bench(args.requests, args.repeat, args.profile, args.burn))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
