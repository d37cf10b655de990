"""Dashboard at scale: page weight, push size, summary cost and update latency with N Programs (10,000).

A router (Program scheduling on) in front of one emulator engine with two Ranks, both in this process; N
Programs each send one short request with a short TTL, so they end up retained. Then headless Chromium
(Debian's, over the DevTools protocol) opens /dashboard and the bench reads, for a number of pushes, the
page's own measure of update latency (render time minus the push's build time). Figures printed:

- page weight: the bytes of the page's three files, and of one push (what arrives every 0.5 s);
- summary build: the time to build the per-Rank aggregates and the sorted Program order, server side;
- update latency: median / p95 / max over the pushes watched; DOM size (elements on the page).

    .venv/bin/python bench/dashboard.py [--programs 10000] [--pushes 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp

from progrouter.config import ProgramSchedulingConfig, RouterConfig
from progrouter.engine import EngineConfig
from progrouter.engine.server import start_engine
from progrouter.server.dashboard.routes import ASSETS
from progrouter.server.runner import start_router
from progrouter.server.state import STATE_KEY

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.browser import Browser


async def load(url: str, programs: int, concurrency: int) -> float:
    started = time.perf_counter()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(programs):
        queue.put_nowait(i)

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            body = {
                "model": "emu",
                "messages": [{"role": "user", "content": f"program {i} says hello"}],
                "max_tokens": 1,
                "vllm_xargs": {
                    "agentic_context": f'{{"program_id": "bench-{i}", "kv_retention_ttl_seconds": 0.05}}'
                },
            }
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200, await response.text()

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return time.perf_counter() - started


async def main(programs: int, pushes: int) -> None:
    engine = await start_engine(
        EngineConfig(port=0, model_name="emu", data_parallel_size=2, num_blocks=200_000, time_scale=1000.0)
    )
    config = RouterConfig(
        worker_urls=[engine.url],
        port=0,
        prometheus_port=None,
        intra_node_data_parallel_size=2,
        health_check_interval_secs=3600.0,
        log_level="warning",
        program_scheduling=ProgramSchedulingConfig(token_capacity_per_dp_rank=3_000_000),
    )
    router = await start_router(config)
    try:
        seconds = await load(router.url, programs, 64)
        print(f"loaded {programs} Programs in {seconds:.1f} s")
        gate = router.app[STATE_KEY].gate
        assert gate is not None
        builds = []
        for _ in range(10):
            t0 = time.perf_counter()
            summary = gate.summary()
            summary.counts()
            summary.page(0, 50)
            builds.append(time.perf_counter() - t0)
        print(f"Programs in the scheduler: {summary.programs}; counts {summary.counts()}")
        print(
            "summary build (aggregates + order + counts + one page): "
            f"median {statistics.median(builds) * 1e3:.1f} ms"
        )
        async with aiohttp.ClientSession() as session:
            weight = 0
            for name in ASSETS:
                path = "/dashboard" if name == "index.html" else f"/dashboard/{name}"
                async with session.get(router.url + path) as response:
                    weight += len(await response.read())
            async with session.get(router.url + "/dashboard/stream") as response:
                push = await response.content.readline()
        print(f"page weight: {weight:,} bytes (html+js+css, uncompressed); one push: {len(push):,} bytes")
        browser = await Browser.launch()
        try:
            await browser.goto(router.url + "/dashboard")
            await browser.wait_for("window.dashboardStats.pushes >= 1")
            latencies = []
            seen = await browser.evaluate("window.dashboardStats.pushes")
            while len(latencies) < pushes:
                await browser.wait_for(f"window.dashboardStats.pushes > {seen}")
                seen, latency = await browser.evaluate(
                    "[window.dashboardStats.pushes, window.dashboardStats.lastLatencyMs]"
                )
                latencies.append(latency)
            elements = await browser.evaluate("document.getElementsByTagName('*').length")
            rows = await browser.evaluate("document.querySelectorAll('#rows tr').length")
        finally:
            await browser.close()
        latencies.sort()
        p95 = latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))]
        print(
            f"update latency over {len(latencies)} pushes: median {statistics.median(latencies):.0f} ms, "
            f"p95 {p95:.0f} ms, max {latencies[-1]:.0f} ms (push interval 500 ms)"
        )
        print(f"DOM: {elements} elements, {rows} table rows")
    finally:
        await router.stop()
        await engine.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=10_000)
    parser.add_argument("--pushes", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.programs, args.pushes))
