"""``GET /metrics``: vLLM's Prometheus series for every Rank, read from the cores at scrape time.

Names, types and bucket bounds follow vLLM v1; each series carries ``model_name`` and ``engine`` (the Rank),
which is how the router's observer tells Ranks of one server apart. Counters are the cores' monotone totals,
so a scrape never changes state.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from progrouter.engine.core import EngineCore
from progrouter.engine.stats import Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LABELS = ["model_name", "engine"]


def _histogram(name: str, doc: str, cores: Sequence[EngineCore], model: str, pick: str) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=_LABELS)
    for core in cores:
        hist: Histogram = getattr(core.stats, pick)
        buckets = [("+Inf" if b == float("inf") else repr(b), c) for b, c in hist.cumulative()]
        family.add_metric([model, str(core.rank)], buckets, hist.sum)
    return family


class EngineCollector:
    """A prometheus_client collector over the live cores (no state of its own)."""

    def __init__(self, cores: Sequence[EngineCore], model_name: str) -> None:
        self.cores = cores
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        model, cores = self.model_name, self.cores
        gauges = (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", "num_running"),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "num_waiting"),
        )
        for name, doc, attr in gauges:
            g = GaugeMetricFamily(name, doc, labels=_LABELS)
            for core in cores:
                g.add_metric([model, str(core.rank)], getattr(core, attr))
            yield g
        usage = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels=_LABELS
        )
        for core in cores:
            usage.add_metric([model, str(core.rank)], core.kv_cache_usage())
        yield usage
        counters = (
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens"),
            ("vllm:prompt_tokens_cached", "Number of prefill tokens served from the prefix cache.",
             "prompt_tokens_cached"),
            ("vllm:generation_tokens", "Number of generation tokens processed.", "generation_tokens"),
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
             "prefix_cache_queries"),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
             "prefix_cache_hits"),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "num_preemptions"),
        )  # fmt: skip
        for name, doc, attr in counters:
            c = CounterMetricFamily(name, doc, labels=_LABELS)
            for core in cores:
                c.add_metric([model, str(core.rank)], getattr(core.stats, attr))
            yield c
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*_LABELS, "finished_reason"],
        )
        for core in cores:
            for reason, n in core.stats.request_success.items():
                success.add_metric([model, str(core.rank), reason], n)
        yield success
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["engine", "model_name", "block_size", "num_gpu_blocks", "enable_prefix_caching"],
        )
        for core in cores:
            cfg = core.config
            info.add_metric([str(core.rank), model, str(cfg.block_size), str(cfg.num_blocks), "True"], 1.0)
        yield info
        yield _histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            cores,
            model,
            "ttft",
        )
        yield _histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            cores,
            model,
            "e2e",
        )


def render_metrics(cores: Sequence[EngineCore], model_name: str) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(cores, model_name))
    data: bytes = generate_latest(registry)
    return data
