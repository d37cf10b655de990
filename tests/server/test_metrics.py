"""Prometheus exposition: per-router registries, bounded labels, served on the metrics port."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from progrouter.server.telemetry.metrics import RouterMetrics
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
    for path in ("/v1/chat/completions", "/v1/chat/completions", "/v1/embeddings"):
        async with client.post(router.url + path, json={}) as resp:
            assert resp.status == 200
    async with client.post(router.url + "/v1/completions", data=b"{oops") as resp:
        assert resp.status == 400

    async with client.get(router.metrics_url) as resp:
        assert resp.status == 200
        text = await resp.text()
    answers = _samples(text, "progrouter_requests_total")
    assert answers[(("route", "/v1/chat/completions"), ("status", "2xx"), ("target", worker.url))] == 2
    assert answers[(("route", "/v1/embeddings"), ("status", "2xx"), ("target", worker.url))] == 1
    assert answers[(("route", "/v1/completions"), ("status", "4xx"), ("target", "none"))] == 1
    counts = _samples(text, "progrouter_request_duration_seconds_count")
    assert counts[(("route", "/v1/chat/completions"), ("target", worker.url))] == 2
    # upstream's families, with upstream's meanings: requests_total counts successes
    assert _samples(text, "vllm_router_requests_total") == {
        (("route", "/v1/chat/completions"),): 2,
        (("route", "/v1/embeddings"),): 1,
    }
    errors = _samples(text, "vllm_router_request_errors_total")
    assert errors == {(("error_type", "bad_request"), ("route", "/v1/completions")): 1}
    assert _samples(text, "vllm_router_worker_health") == {(("worker", worker.url),): 1.0}
    assert _samples(text, "vllm_router_active_workers") == {(): 1.0}
    assert _samples(text, "vllm_router_processed_requests_total") == {(("worker", worker.url),): 3}
    decisions = _samples(text, "vllm_router_policy_decisions_total")
    assert decisions == {(("policy", "round_robin"), ("worker", worker.url)): 3}
    assert _samples(text, "vllm_router_cb_state") == {(("worker", worker.url),): 0.0}
    assert _samples(text, "vllm_router_generate_duration_seconds_count") == {(): 3}
    assert "_created" not in text  # upstream exposes no creation timestamps

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


async def test_cache_aware_hits_misses_and_tree_size(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    w0, w1 = await make_worker(), await make_worker()
    router = await make_router([w0.url, w1.url], policy="cache_aware", prometheus_port=0)
    assert router.metrics_url is not None
    prompt = "the same long conversation prefix " * 4
    for _ in range(3):
        async with client.post(router.url + "/v1/completions", json={"prompt": prompt}) as resp:
            assert resp.status == 200
    async with client.get(router.metrics_url) as resp:
        text = await resp.text()
    assert _samples(text, "vllm_router_cache_misses_total") == {(): 1}  # the first sight of the prompt
    assert _samples(text, "vllm_router_cache_hits_total") == {(): 2}
    chosen, other = (w0.url, w1.url) if w0.requests else (w1.url, w0.url)
    sizes = _samples(text, "vllm_router_tree_size")  # characters each worker holds, as of the last choice
    assert sizes == {(("worker", chosen),): len(prompt), (("worker", other),): 0}
    assert _samples(text, "vllm_router_policy_decisions_total") == {
        (("policy", "cache_aware"), ("worker", chosen)): 3
    }
    assert _samples(text, "vllm_router_max_load") == {(): 0.0}


def test_forgetting_a_worker_drops_its_gauges_until_it_is_seen_again() -> None:
    metrics = RouterMetrics(CollectorRegistry())
    for worker in ("http://a:1", "http://b:1"):
        metrics.child(metrics.running_requests, worker).inc()
        metrics.worker_healthy.labels(worker).set(1)
        metrics.child(metrics.processed_requests, worker).inc()
    metrics.forget_worker("http://a:1")
    text = generate_latest(metrics.registry).decode()
    assert _samples(text, "vllm_router_running_requests") == {(("worker", "http://b:1"),): 1.0}
    assert _samples(text, "vllm_router_worker_health") == {(("worker", "http://b:1"),): 1.0}
    assert len(_samples(text, "vllm_router_processed_requests_total")) == 2  # counters keep their history
    metrics.child(metrics.running_requests, "http://a:1").inc()  # added again: a fresh, visible series
    text = generate_latest(metrics.registry).decode()
    assert _samples(text, "vllm_router_running_requests")[(("worker", "http://a:1"),)] == 1.0


def test_both_in_flight_gauges_read_one_count_per_target() -> None:
    metrics = RouterMetrics(CollectorRegistry())

    def in_flight() -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        text = generate_latest(metrics.registry).decode()
        names = ("vllm_router_running_requests", "vllm_router_worker_load", "vllm_router_cb_outcomes_total")
        return {name: _samples(text, name) for name in names}

    a = metrics.target("http://a:1")
    a.started()
    a.started()
    seen = in_flight()
    assert seen["vllm_router_running_requests"] == {(("worker", "http://a:1"),): 2.0}
    assert seen["vllm_router_worker_load"] == {(("worker", "http://a:1"),): 2.0}
    a.finished(True)
    a.finished(None)  # an attempt the circuit breaker hears nothing about
    seen = in_flight()
    assert seen["vllm_router_running_requests"] == {(("worker", "http://a:1"),): 0.0}
    assert seen["vllm_router_worker_load"] == {(("worker", "http://a:1"),): 0.0}
    assert seen["vllm_router_cb_outcomes_total"] == {
        (("outcome", "success"), ("worker", "http://a:1")): 1.0,
        (("outcome", "failure"), ("worker", "http://a:1")): 0.0,
    }
    a.started()
    metrics.forget_worker("http://a:1")  # gone: no stale series, even with an attempt in flight
    assert in_flight()["vllm_router_running_requests"] == {}
    metrics.target("http://a:1").started()  # seen again: a fresh count, visible at once
    assert in_flight()["vllm_router_worker_load"] == {(("worker", "http://a:1"),): 1.0}
