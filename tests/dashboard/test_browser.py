"""The dashboard in a real browser (Debian's headless Chromium over the DevTools protocol).

A router in front of two emulator Ranks under a small replay: the page loads, shows both Ranks, shows one
Program move running → retained → running, and keeps receiving pushes. Writes reports/dashboard.png.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from integration.helpers import CAPACITY, program_body, words
from progrouter.program.core.diagnostics import redact
from progrouter.server.runner import RunningRouter
from support.browser import Browser
from support.factories import EngineFactory, RouterFactory

pytestmark = pytest.mark.timeout(120)
CHAT = "/v1/chat/completions"
SCREENSHOT = Path(__file__).resolve().parents[2] / "reports" / "dashboard.png"


async def post(
    client: aiohttp.ClientSession, router: RunningRouter, program: str, n: int, ttl: float, task: str = "bg"
) -> None:
    body = program_body(program, words("w", n), kv_retention_ttl_seconds=ttl, task_id=task)
    async with client.post(router.url + CHAT, json=body) as response:
        assert response.status == 200


async def replay(client: aiohttp.ClientSession, router: RunningRouter, stop: asyncio.Event) -> None:
    """Background Programs that come and go on both Ranks while the test watches one Program."""
    rounds = 0
    while not stop.is_set():
        await asyncio.gather(*(post(client, router, f"bg-{i}", 100 + 10 * rounds, 0.3) for i in range(4)))
        rounds += 1
        await asyncio.sleep(0.2)


def state_of(program: str) -> str:
    return f"document.querySelector('tr[data-program=\"{program}\"] td:nth-child(2)')?.textContent"


async def test_the_page_shows_both_ranks_and_a_program_moving(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engines = [await make_engine(), await make_engine()]
    router = await make_router(
        [e.url for e in engines], {"token_capacity_per_dp_rank": CAPACITY, "metrics_interval_seconds": 0.1}
    )
    browser = await Browser.launch()
    stop = asyncio.Event()
    background = asyncio.create_task(replay(client, router, stop))
    try:
        await browser.goto(router.url + "/dashboard")
        await browser.wait_for("document.querySelectorAll('.rank').length === 2")
        shown = await browser.evaluate("[...document.querySelectorAll('.rank h3')].map(h => h.textContent)")
        diagnostics = await (await client.get(router.url + "/scheduling/diagnostics")).json()
        assert sorted(shown) == sorted(r["target_id"] for r in diagnostics["ranks"])

        await post(client, router, "watched-a", 300, ttl=3.0, task="watched")
        diagnostics = await (await client.get(router.url + "/scheduling/diagnostics")).json()
        (watched,) = [
            p["program"]
            for r in diagnostics["ranks"]
            for p in r["programs"]
            if p["task_id"] == redact("watched")
        ]
        await browser.wait_for(f"{state_of(watched)} === 'running'")
        await browser.wait_for(f"{state_of(watched)} === 'retained'")  # its 3 s TTL ran out
        await post(client, router, "watched-a", 320, ttl=30.0, task="watched")
        await browser.wait_for(f"{state_of(watched)} === 'running'")

        pushes = await browser.evaluate("window.dashboardStats.pushes")
        await browser.wait_for(f"window.dashboardStats.pushes >= {pushes + 3}")  # still live
        feed = await browser.evaluate(
            "[...document.querySelectorAll('#events li')].map(li => li.textContent)"
        )
        assert any("program_pause" in line and watched in line for line in feed)
        assert not any("watched-a" in line for line in feed)
        path = await browser.screenshot(SCREENSHOT)
        print(f"dashboard screenshot: {path}")
        assert path.stat().st_size > 10_000
    finally:
        stop.set()
        await background
        await browser.close()
