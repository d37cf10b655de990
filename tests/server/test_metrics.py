"""Prometheus exposition: per-router registries, bounded labels, served on the metrics port."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from support.factories import RouterFactory

from .conftest import WorkerFactory


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


async def test_counters_and_histograms_per_target_and_route(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], prometheus_port=0)
    other = await make_router([worker.url], prometheus_port=0)
    assert router.metrics_url is not None and other.metrics_url is not None
    assert router.metrics_url != other.metrics_url
    for path in ("/v1/chat/completions", "/v1/chat/completions", "/some/random/path/123"):
        async with client.post(router.url + path, json={}) as resp:
            assert resp.status == 200
    async with client.post(router.url + "/v1/completions", data=b"{oops") as resp:
        assert resp.status == 400

    async with client.get(router.metrics_url) as resp:
        assert resp.status == 200
        text = await resp.text()
    requests = _samples(text, "progrouter_requests_total")
    assert requests[(("route", "/v1/chat/completions"), ("status", "2xx"), ("target", worker.url))] == 2
    assert requests[(("route", "other"), ("status", "2xx"), ("target", worker.url))] == 1
    assert requests[(("route", "/v1/completions"), ("status", "4xx"), ("target", "none"))] == 1
    counts = _samples(text, "progrouter_request_duration_seconds_count")
    assert counts[(("route", "/v1/chat/completions"), ("target", worker.url))] == 2
    assert _samples(text, "progrouter_worker_healthy") == {(("worker", worker.url),): 1.0}

    async with client.get(other.metrics_url) as resp:
        assert _samples(await resp.text(), "progrouter_requests_total") == {}
    assert router.registry is not other.registry


async def test_a_client_that_leaves_is_counted_as_error(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], prometheus_port=0)
    metrics_url = router.metrics_url
    assert metrics_url is not None
    task = asyncio.create_task(client.post(router.url + "/v1/completions", json={"test_mode": "slow"}))
    await asyncio.wait_for(worker.received.wait(), timeout=5)
    task.cancel()
    await asyncio.wait_for(worker.cancelled.wait(), timeout=5)
    key = (("route", "/v1/completions"), ("status", "error"), ("target", worker.url))

    async def counted() -> None:
        while True:
            async with client.get(metrics_url) as resp:
                if _samples(await resp.text(), "progrouter_requests_total").get(key) == 1:
                    return
            await asyncio.sleep(0.01)

    await asyncio.wait_for(counted(), timeout=5)


async def test_metrics_can_be_disabled(make_worker: WorkerFactory, make_router: RouterFactory) -> None:
    worker = await make_worker()
    router = await make_router([worker.url], prometheus_port=None)
    assert router.metrics_url is None
