"""Metric families: after the same traffic, every ``vllm_router_*`` family the wheel exposes is exposed by
progrouter with the same type and label names (dashboards and alerts keep working)."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from support.scripted_worker import Script, ScriptedWorker

from .conftest import Launcher, WorkerFactory, flags
from .helpers import families, post
from .routers import ROUTERS, RouterProcess

# What the wheel showed after this traffic (round_robin); checked so the comparison cannot pass vacuously.
CORE = {
    "vllm_router_requests_total": ("counter", {"route"}),
    "vllm_router_processed_requests_total": ("counter", {"worker"}),
    "vllm_router_policy_decisions_total": ("counter", {"policy", "worker"}),
    "vllm_router_retries_total": ("counter", {"route"}),
    "vllm_router_retries_exhausted_total": ("counter", {"route"}),
    "vllm_router_retry_backoff_duration_seconds": ("histogram", {"attempt"}),
    "vllm_router_generate_duration_seconds": ("histogram", set()),
    "vllm_router_cb_state": ("gauge", {"worker"}),
    "vllm_router_cb_state_transitions_total": ("counter", {"worker", "from", "to"}),
    "vllm_router_cb_outcomes_total": ("counter", {"worker", "outcome"}),
    "vllm_router_worker_health": ("gauge", {"worker"}),
    "vllm_router_active_workers": ("gauge", set()),
}


async def traffic(
    http: aiohttp.ClientSession, router: RouterProcess, a: ScriptedWorker, b: ScriptedWorker
) -> str:
    """Retries, an exhausted retry, a breaker opening, chat and completions; then one scrape."""
    a.reset(Script(fail_first=3))
    b.reset(Script(fail_first=1, fail_status=503))
    for _ in range(8):
        await post(http, router.url)
    chat = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
    await post(http, router.url, path="/v1/chat/completions", body=chat)
    async with http.get(router.metrics_url) as resp:
        assert resp.status == 200
        return await resp.text()


async def test_vllm_router_families_match_the_wheel(
    workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    a, b = await workers(2)
    cb = ["--cb-failure-threshold", "2", "--cb-timeout-duration-secs", "60"]
    same = flags([a.url, b.url], "--retry-max-retries", "2", *cb)
    seen: dict[str, dict[str, tuple[str, frozenset[str]]]] = {}
    for kind in ROUTERS:
        router = await launch(kind, same)
        scrape = families(await traffic(http, router, a, b))
        seen[kind] = {name: fam for name, fam in scrape.items() if name.startswith("vllm_router_")}
        await router.stop()
    upstream = seen["upstream"]
    assert {n: (t, set(ls)) for n, (t, ls) in upstream.items() if n in CORE} == CORE
    assert {n: seen["progrouter"].get(n) for n in upstream} == upstream
