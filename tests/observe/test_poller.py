"""The /metrics scraper and the observation loop, against real loopback HTTP servers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from aiohttp.log import access_logger

from progrouter.observe.poller import FAILED_MESSAGE, RECOVERED_MESSAGE, MetricsScraper, run_observation_loop
from progrouter.program.types import BackendObservation
from progrouter.routing.target import Target
from support.loopback import serve_app
from support.redirect import redirect_to_canary

pytestmark = pytest.mark.timeout(30)

TEXT = (
    'vllm:kv_cache_usage_perc{engine="0"} 0.1\n'
    'vllm:num_requests_running{engine="0"} 1\n'
    'vllm:num_requests_waiting{engine="0"} 0\n'
    'vllm:kv_cache_usage_perc{engine="1"} 0.9\n'
    'vllm:num_requests_running{engine="1"} 5\n'
    'vllm:num_requests_waiting{engine="1"} 2\n'
)


@dataclass
class FakeWorker:
    status: int = 200
    text: str = TEXT
    delay: float = 0.0
    hits: int = 0
    auth: list[str | None] = field(default_factory=list)
    url: str = ""


async def _serve(worker: FakeWorker) -> web.AppRunner:
    async def metrics(request: web.Request) -> web.Response:
        worker.hits += 1
        worker.auth.append(request.headers.get("Authorization"))
        if worker.delay:
            await asyncio.sleep(worker.delay)
        return web.Response(status=worker.status, text=worker.text)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    # aiohttp's own defaults (handlers not cancelled, access log on) rather than serve_app's
    runner, worker.url = await serve_app(app, handler_cancellation=False, access_log=access_logger)
    return runner


@pytest.fixture
async def workers() -> AsyncIterator[list[FakeWorker]]:
    ws = [FakeWorker(), FakeWorker()]
    runners = [await _serve(w) for w in ws]
    yield ws
    for r in runners:
        await r.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def ranks(worker: FakeWorker) -> list[Target]:
    return [Target.parse(f"{worker.url}@{r}") for r in (0, 1)]


async def test_one_get_per_worker_url_with_bearer_key(
    workers: list[FakeWorker], session: aiohttp.ClientSession
) -> None:
    scraper = MetricsScraper(session, api_key="sekrit")
    observed = await scraper.scrape(ranks(workers[0]) + ranks(workers[1]))
    assert [w.hits for w in workers] == [1, 1]
    assert workers[0].auth == ["Bearer sekrit"]
    assert len(observed) == 4
    assert observed[f"{workers[1].url}@1"] == BackendObservation(0.9, 5, 2)
    assert observed[f"{workers[0].url}@0"] == BackendObservation(0.1, 1, 0)


async def test_no_auth_header_without_key(workers: list[FakeWorker], session: aiohttp.ClientSession) -> None:
    await MetricsScraper(session).scrape(ranks(workers[0]))
    assert workers[0].auth == [None]


async def test_failures_log_once_per_change_and_recovery_once(
    workers: list[FakeWorker], session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="progrouter.observe")
    scraper = MetricsScraper(session)
    bad, good = workers
    bad.status = 500
    for _ in range(3):
        observed = await scraper.scrape(ranks(bad) + ranks(good))
        assert set(observed) == {t.id for t in ranks(good)}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert FAILED_MESSAGE in warnings[0].getMessage()
    assert f"base_url={bad.url}" in warnings[0].getMessage()
    assert "error=HTTP 500" in warnings[0].getMessage()
    assert sum(1 for r in caplog.records if r.levelno == logging.DEBUG) == 2
    bad.status = 503  # a different error is worth a new warning
    await scraper.scrape(ranks(bad))
    assert sum(1 for r in caplog.records if r.levelno == logging.WARNING) == 2
    bad.status = 200
    await scraper.scrape(ranks(bad))
    await scraper.scrape(ranks(bad))
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1
    assert RECOVERED_MESSAGE in infos[0].getMessage()


async def test_timeout_malformed_and_unreachable_do_not_raise(
    workers: list[FakeWorker], session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="progrouter.observe")
    slow, malformed = workers
    slow.delay = 1.0
    malformed.text = 'vllm:kv_cache_usage_perc{engine="0" 0.5\n'
    targets = [*ranks(slow), *ranks(malformed), Target.parse("http://127.0.0.1:9@0")]
    assert await MetricsScraper(session, timeout_seconds=0.2).scrape(targets) == {}
    messages = sorted(r.getMessage() for r in caplog.records)
    assert len(messages) == 3
    assert any("timed out after 0.2 s" in m for m in messages)
    assert any("ValueError" in m for m in messages)
    assert any("http://127.0.0.1:9" in m for m in messages)


async def test_loop_fetches_nothing_without_targets_then_brackets_each_scrape(
    workers: list[FakeWorker], session: aiohttp.ClientSession
) -> None:
    worker = workers[0]
    current: list[Target] = []
    calls: list[tuple[str, object]] = []
    asked = 0
    idle = asyncio.Event()
    applied = asyncio.Event()

    def targets() -> list[Target]:
        nonlocal asked
        asked += 1
        if asked >= 3:
            idle.set()
        return current

    def begin() -> int:
        calls.append(("begin", worker.hits))
        return len(calls)

    def apply(epoch: int, observed: dict[str, BackendObservation]) -> None:
        calls.append(("apply", (epoch, worker.hits, sorted(observed))))
        applied.set()

    task = asyncio.create_task(run_observation_loop(MetricsScraper(session), 0.01, targets, begin, apply))
    try:
        await asyncio.wait_for(idle.wait(), 5)
        assert worker.hits == 0  # three intervals without targets: nothing fetched
        assert calls == []
        current.extend(ranks(worker))
        await asyncio.wait_for(applied.wait(), 5)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    # begin ran before the GET, apply after it, with the epoch begin returned.
    assert calls[0] == ("begin", 0)
    assert calls[1] == ("apply", (1, 1, sorted(t.id for t in ranks(worker))))


async def test_a_redirect_is_a_failed_scrape_never_followed(session: aiohttp.ClientSession) -> None:
    async with redirect_to_canary() as redirect:
        targets = [Target.parse(f"{redirect.worker_url}@0")]
        assert await MetricsScraper(session, api_key="sekrit").scrape(targets) == {}
        assert redirect.canary_hits == 0
