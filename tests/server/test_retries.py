"""One retry loop for native and Program requests, over loopback against scripted workers."""

from __future__ import annotations

import random

import aiohttp
import pytest

from progrouter.config import ProgramSchedulingConfig
from progrouter.server.hop.retry import RetryPolicy, is_retryable
from support.factories import RouterFactory

from .conftest import WorkerFactory
from .test_metrics import _samples
from .test_program_path import _diagnostics, _in_flight, _program_body

FAST = {"retry_initial_backoff_ms": 1, "retry_max_backoff_ms": 5}


async def _post_many(client: aiohttp.ClientSession, url: str, n: int) -> list[int]:
    statuses = []
    for _ in range(n):
        async with client.post(url + "/v1/completions", json={"prompt": "x"}) as resp:
            await resp.read()
            statuses.append(resp.status)
    return statuses


async def test_a_worker_always_answering_500_is_retried_on_the_healthy_one(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    # upstream 0.1.17 observed: one worker always 500, one healthy, --retry-max-retries 3 → all 200
    bad, good = await make_worker(), await make_worker()
    bad.mode = "status:500"
    router = await make_router([bad.url, good.url], retry_max_retries=3, prometheus_port=0, **FAST)
    assert await _post_many(client, router.url, 10) == [200] * 10
    assert len(good.requests) == 10 and len(bad.requests) >= 1
    assert router.metrics_url is not None
    async with client.get(router.metrics_url) as resp:
        text = await resp.text()
    retries = _samples(text, "vllm_router_retries_total")[(("route", "/v1/completions"),)]
    assert retries == len(bad.requests)
    backoffs = _samples(text, "vllm_router_retry_backoff_duration_seconds_count")
    assert backoffs == {(("attempt", "1"),): retries}
    outcomes = _samples(text, "vllm_router_cb_outcomes_total")
    assert outcomes[(("outcome", "failure"), ("worker", bad.url))] == len(bad.requests)
    assert outcomes[(("outcome", "success"), ("worker", good.url))] == 10


async def test_disable_retries_surfaces_the_failure(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    bad, good = await make_worker(), await make_worker()
    bad.mode = "status:500"
    router = await make_router([bad.url, good.url], disable_retries=True, retry_max_retries=5, **FAST)
    statuses = await _post_many(client, router.url, 4)
    assert sorted(statuses) == [200, 200, 500, 500]  # round robin: every other request meets the 500
    assert len(bad.requests) == 2 and len(good.requests) == 2


@pytest.mark.parametrize(
    ("status", "retried"), [(408, True), (429, True), (503, True), (400, False), (501, False)]
)
async def test_which_statuses_are_retried(
    make_worker: WorkerFactory,
    make_router: RouterFactory,
    client: aiohttp.ClientSession,
    status: int,
    retried: bool,
) -> None:
    worker = await make_worker()
    worker.script = [f"status:{status}"]
    router = await make_router([worker.url], retry_max_retries=2, **FAST)
    assert await _post_many(client, router.url, 1) == [200 if retried else status]
    assert len(worker.requests) == (2 if retried else 1)


async def test_a_dropped_connection_is_retried_and_the_last_failure_is_answered(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    worker.script = ["close", "close"]
    router = await make_router([worker.url], retry_max_retries=3, **FAST)
    assert await _post_many(client, router.url, 1) == [200]  # one worker: the policy may pick it again
    worker.script = ["close", "close"]
    once = await make_router([worker.url], retry_max_retries=2, **FAST)
    assert await _post_many(client, once.url, 1) == [502]  # attempts used up: the router answers
    assert len(worker.requests) == 5


async def test_a_program_request_is_retried_through_the_gate_and_its_ticket_finished(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    worker.script = ["status:500", "close"]
    router = await make_router(
        [worker.url], retry_max_retries=3, program_scheduling=ProgramSchedulingConfig(), **FAST
    )
    async with client.post(router.url + "/v1/chat/completions", json=_program_body("task-r")) as resp:
        assert resp.status == 200
    assert len(worker.requests) == 3
    diagnostics = await _diagnostics(client, router.url)
    assert _in_flight(diagnostics) == 0
    # usage is charged once: only the relayed attempt completed successfully
    assert sum(rank["rolling"]["request_samples"] for rank in diagnostics["ranks"]) == 1


async def test_a_program_stream_that_broke_after_its_first_byte_is_not_retried(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router(
        [worker.url], retry_max_retries=3, program_scheduling=ProgramSchedulingConfig(), **FAST
    )
    body = _program_body("task-s", test_mode="break")
    async with client.post(router.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()
    assert len(worker.requests) == 1
    assert _in_flight(await _diagnostics(client, router.url)) == 0


def test_backoff_grows_by_the_multiplier_up_to_the_cap_within_the_jitter() -> None:
    policy = RetryPolicy(attempts=6, initial_backoff_ms=50, max_backoff_ms=120, multiplier=1.5, jitter=0.0)
    rng = random.Random(0)
    assert [policy.backoff_seconds(n, rng) for n in (1, 2, 3, 4)] == [0.05, 0.075, 0.1125, 0.12]
    jittered = RetryPolicy(attempts=6, initial_backoff_ms=100, max_backoff_ms=9999, multiplier=2, jitter=0.2)
    samples = [jittered.backoff_seconds(2, rng) for _ in range(200)]
    assert all(0.16 <= s <= 0.24 for s in samples)
    assert max(samples) - min(samples) > 0.04  # the jitter really spreads them


def test_retryable_statuses_are_upstreams() -> None:
    assert [s for s in range(400, 600) if is_retryable(s)] == [408, 429, 500, 502, 503, 504]
