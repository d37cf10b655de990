"""Envoy + EPP against `progrouter serve` and against Envoy alone: added latency, throughput, router CPU.

Two trivial loopback workers (their own processes) answer a 4-token chat completion, as JSON or as SSE (four
token chunks, a usage chunk, ``[DONE]``). Five ways to reach them, each measured on the same Program requests
(an ``agentic_context``, 8 Programs), non-streaming and streaming:

- ``direct``: straight to one worker (the baseline of "added p50");
- ``envoy-rr``: Envoy alone, round robin over both workers (no Program scheduling: the data plane's cost);
- ``serve``: `progrouter serve`, round_robin, Program scheduling on;
- ``envoy+epp``: Envoy whose ext_proc filter asks `progrouter epp` (same flags as serve), ORIGINAL_DST;
- ``envoy+epp-end``: the same with ``--epp-response-body end`` (no response body to the EPP).

Per cell: added p50 (ms, concurrency 1, minus direct), requests/s at concurrency 64, CPU µs per request
(user+system from /proc over both concurrencies) of the router (serve's process, or the EPP's) and of Envoy,
and the ext_proc messages per request Envoy sent the EPP (its ``progrouter_epp_messages_total``).
Envoy runs with ``--concurrency 1`` (one worker thread, as the Python shells have one event loop).

    .venv/bin/python bench/epp.py [--requests 1000] [--repeat 1] [--profile]

``--profile`` runs the EPP arms under ``bench/overhead.py``'s CPU sampler and prints, per load, the ext_proc
messages per request, the EPP's CPU per message and where it goes.
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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from _loopback import free_port, loadavg, run_worker, tree_cpu, wait_ready
from progrouter.epp.bootstrap import epp_bootstrap, round_robin_bootstrap
from progrouter.epp.envoy import envoy_version, start_envoy

PROGRAMS = 8
PROFILE_DIR: str | None = None  # --profile: where the EPP arms' samples go
_MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]
USAGE = {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}
ANSWER = json.dumps(
    {
        "id": "cmpl-1",
        "object": "chat.completion",
        "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": USAGE,
    }
).encode()


def _chunk(payload: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


SSE = [
    *(
        _chunk({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": f"t{i}"}}]})
        for i in range(4)
    ),
    _chunk({"object": "chat.completion.chunk", "choices": [], "usage": USAGE}),
    b"data: [DONE]\n\n",
]


def program_body(i: int, stream: bool) -> bytes:
    context = json.dumps({"task_id": f"task-{i % PROGRAMS}", "agent_id": "lead"})
    body: dict[str, object] = {"model": "bench", "messages": _MESSAGES, "max_tokens": 4, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps({**body, "vllm_xargs": {"agentic_context": context}}).encode()


def serve_worker(port: int) -> None:
    """A trivial worker: a fixed completion, JSON or SSE as asked; /health."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        if not body.get("stream"):
            return web.Response(body=ANSWER, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in SSE:
            await response.write(chunk)
        await response.write_eof()
        return response

    run_worker(port, chat)


@dataclass
class Cell:
    rps: float
    p50_ms: float


async def load(
    session: aiohttp.ClientSession, url: str, stream: bool, requests: int, concurrency: int
) -> Cell:
    latencies: list[float] = []
    sent = 0
    headers = {"Content-Type": "application/json"}

    async def one_client() -> None:
        nonlocal sent
        while sent < requests:
            body = program_body(sent, stream)
            sent += 1
            start = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as resp:
                data = await resp.read()
                assert resp.status == 200, (resp.status, data[:200])
                assert (b"[DONE]" in data) if stream else (b'"usage"' in data)
            latencies.append(time.perf_counter() - start)

    began = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    return Cell(len(latencies) / (time.perf_counter() - began), statistics.median(latencies) * 1e3)


@dataclass
class Row:
    arm: str
    stream: bool
    p50_ms: float
    rps_64: float
    router_us: float | None
    envoy_us: float | None
    messages: float | None  # ext_proc messages Envoy sent the EPP per request (its own counter)


def _cpu(pid: int | None) -> float:
    return sum(tree_cpu(pid)) if pid is not None else 0.0


def _shell(
    command: str, workers: list[int], port: int, admin_port: int, response_body: str, metrics_port: int
) -> subprocess.Popen[bytes]:
    flags = [
        "--worker-urls", *(f"http://127.0.0.1:{w}" for w in workers),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--policy", "round_robin",
        "--prometheus-port", str(metrics_port),
        "--log-level", "warning",
        "--enable-program-scheduling",
    ]  # fmt: skip
    if command == "epp":
        flags += ["--admin-port", str(admin_port), "--epp-response-body", response_body]
    cmd = [sys.executable, "-m", "progrouter", command, *flags]
    if PROFILE_DIR is not None and command == "epp":  # the EPP under overhead.py's CPU sampler (SIGUSR1)
        out = os.path.join(PROFILE_DIR, response_body)
        cmd = [
            sys.executable,
            str(Path(__file__).with_name("overhead.py")),
            "--serve-profiled",
            out,
            "--",
            command,
        ]
        cmd += flags
    return subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL)


@dataclass
class Arm:
    url: str
    router_pid: int | None
    envoy_pid: int | None
    metrics_url: str | None = None  # the EPP's /metrics


async def _messages(session: aiohttp.ClientSession, metrics_url: str | None) -> float:
    """The EPP's ``progrouter_epp_messages_total``, all phases."""
    if metrics_url is None:
        return 0.0
    async with session.get(metrics_url) as response:
        text = await response.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("progrouter_epp_messages_total{")
    )


@asynccontextmanager
async def arm(name: str, workers: list[int], session: aiohttp.ClientSession) -> AsyncIterator[Arm]:
    """Start one way of reaching the workers; stop it after."""
    worker_url = f"http://127.0.0.1:{workers[0]}"
    if name == "direct":
        yield Arm(worker_url, None, None)
        return
    limits = {"request_timeout_seconds": 60.0, "max_request_bytes": 1 << 20}
    process: subprocess.Popen[bytes] | None = None
    envoy = None
    try:
        if name == "envoy-rr":
            envoy = await start_envoy(round_robin_bootstrap([("127.0.0.1", w) for w in workers], **limits))
            yield Arm(envoy.url, None, envoy.process.pid)
            return
        port, admin = free_port(), free_port()
        response_body = "end" if name == "envoy+epp-end" else "stream"
        metrics = free_port()
        process = _shell("serve" if name == "serve" else "epp", workers, port, admin, response_body, metrics)
        ready = f"http://127.0.0.1:{port if name == 'serve' else admin}/readiness"
        await wait_ready(session, ready)
        if name == "serve":
            yield Arm(f"http://127.0.0.1:{port}", process.pid, None)
            return
        bootstrap = epp_bootstrap(
            ("127.0.0.1", port), queue_timeout_seconds=600.0, response_body=response_body, **limits
        )
        envoy = await start_envoy(bootstrap)
        yield Arm(envoy.url, process.pid, envoy.process.pid, f"http://127.0.0.1:{metrics}/metrics")
    finally:
        if envoy is not None:
            await envoy.stop()
        if process is not None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)


async def measure(name: str, workers: list[int], requests: int) -> list[Row]:
    rows = []
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector) as session, arm(name, workers, session) as running:
        url = running.url + "/v1/chat/completions"
        for stream in (False, True):
            await load(session, url, stream, min(200, requests), 4)  # warm-up
            messages0 = await _messages(session, running.metrics_url)
            profiled = PROFILE_DIR is not None and running.metrics_url is not None and running.router_pid
            if profiled:
                os.kill(running.router_pid, signal.SIGUSR1)  # type: ignore[arg-type]  # start a segment
            router0, envoy0 = _cpu(running.router_pid), _cpu(running.envoy_pid)
            one = await load(session, url, stream, requests, 1)
            many = await load(session, url, stream, requests, 64)
            router1, envoy1 = _cpu(running.router_pid), _cpu(running.envoy_pid)
            if profiled:
                os.kill(running.router_pid, signal.SIGUSR1)  # type: ignore[arg-type]  # end it
            messages = (await _messages(session, running.metrics_url) - messages0) / (2 * requests)
            if profiled:
                part = f"{'end' if name.endswith('-end') else 'stream'}.{int(stream)}"
                await _report_profile(
                    name, stream, part, (router1 - router0) / (2 * requests) * 1e6, messages
                )

            def per_request(before: float, after: float, pid: int | None) -> float | None:
                return None if pid is None else (after - before) / (2 * requests) * 1e6

            rows.append(
                Row(
                    name,
                    stream,
                    one.p50_ms,
                    many.rps,
                    per_request(router0, router1, running.router_pid),
                    per_request(envoy0, envoy1, running.envoy_pid),
                    messages if running.metrics_url is not None else None,
                )
            )
    return rows


async def _report_profile(name: str, stream: bool, part: str, cpu_us: float, messages: float) -> None:
    """Where the EPP's CPU per request went in this load (the samples of overhead.py's sampler)."""
    from overhead import Segment, breakdown

    assert PROFILE_DIR is not None
    path = os.path.join(PROFILE_DIR, part)
    for _ in range(100):  # the EPP writes the segment when it handles the signal
        if os.path.exists(path):
            break
        await asyncio.sleep(0.05)
    load = "sse" if stream else "json"
    print(f"{name} {load}: {messages:.1f} messages/request, {cpu_us / messages:,.0f} µs/message")
    print("\n".join(breakdown(Segment(path, 0, cpu_us), 25)))


def summarize(runs: list[list[Row]]) -> None:
    def fmt(values: list[float | None], spec: str) -> str:
        present = [v for v in values if v is not None]
        return format(statistics.median(present), spec) if present else "-"

    direct = {
        stream: statistics.median(
            r.p50_ms for run in runs for r in run if (r.arm, r.stream) == ("direct", stream)
        )
        for stream in (False, True)
    }
    header = (
        f"{'arm':>13} {'load':>6} | {'p50 ms':>7} {'added p50':>9} | {'req/s@64':>8}"
        f" | {'router CPU µs/req':>17} {'× serve':>7} {'Envoy CPU µs/req':>16} | {'msgs/req':>8}"
    )
    print(header)
    print("-" * len(header))
    keys = [(r.arm, r.stream) for r in runs[0]]
    for name, stream in keys:
        cells = [r for run in runs for r in run if (r.arm, r.stream) == (name, stream)]
        p50 = statistics.median(c.p50_ms for c in cells)
        # Router CPU over serve's in the same run and load, the median over runs: the comparable figure.
        ratios = [
            mine.router_us / theirs.router_us
            for run in runs
            for mine in run
            for theirs in run
            if (mine.arm, mine.stream) == (name, stream)
            and (theirs.arm, theirs.stream) == ("serve", stream)
            and mine.router_us is not None
            and theirs.router_us
        ]
        ratio = f"{statistics.median(ratios):.2f}" if ratios else "-"
        print(
            f"{name:>13} {'sse' if stream else 'json':>6} | {p50:>7.2f} {p50 - direct[stream]:>9.2f}"
            f" | {statistics.median(c.rps_64 for c in cells):>8.0f}"
            f" | {fmt([c.router_us for c in cells], '.0f'):>17} {ratio:>7}"
            f" {fmt([c.envoy_us for c in cells], '.0f'):>16} | {fmt([c.messages for c in cells], '.1f'):>8}"
        )


async def bench(requests: int, repeat: int, arms: list[str]) -> None:
    workers = [free_port(), free_port()]
    procs = [subprocess.Popen([sys.executable, __file__, "--serve-worker", str(w)]) for w in workers]
    runs: list[list[Row]] = []
    try:
        async with aiohttp.ClientSession() as session:
            for w in workers:
                await wait_ready(session, f"http://127.0.0.1:{w}/health")
        for _ in range(repeat):
            run: list[Row] = []
            for name in arms:
                run.extend(await measure(name, workers, requests))
            runs.append(run)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    print(
        f"Envoy {await envoy_version()}; Program requests ({PROGRAMS} Programs), 2 loopback workers,"
        f" {requests} requests per cell at c=1 and at c=64, {repeat} run(s), {os.cpu_count()} CPUs,"
        f" /proc/loadavg at the end: {loadavg()}"
    )
    summarize(runs)


ARMS = ["direct", "envoy-rr", "serve", "envoy+epp", "envoy+epp-end"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {ARMS}")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run the EPP arms under bench/overhead.py's CPU sampler: where their CPU per request goes",
    )
    parser.add_argument("--serve-worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_worker is not None:
        serve_worker(args.serve_worker)
        return 0
    arms = args.arms.split(",")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or "direct" not in arms:
        parser.error(f"--arms: unknown {unknown}" if unknown else "--arms must include direct (the baseline)")
    global PROFILE_DIR
    if args.profile:
        PROFILE_DIR = tempfile.mkdtemp(prefix="progrouter-epp-profile-")
    asyncio.run(bench(args.requests, args.repeat, arms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
