"""A Prometheus summary with quantiles, as upstream's Rust exporter renders a histogram without buckets.

prometheus_client's ``Summary`` exposes only ``_sum`` and ``_count``; upstream's scrape of
``vllm_router_agent_aware_queue_wait_seconds`` shows ``quantile`` series as well, labelled 0, 0.5, 0.9,
0.95, 0.99, 0.999 and 1 (written so: PromQL compares label values as strings). This collector keeps, per
label set, the cumulative sum and count and the last ``window`` observations, and computes the quantiles
(nearest rank) over those at scrape time: bounded memory, and quantiles that follow recent behaviour
rather than the whole life of the process.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

QUANTILES = (0.0, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0)
WINDOW = 1024


class _Series:
    __slots__ = ("count", "recent", "total")

    def __init__(self, window: int) -> None:
        self.recent: deque[float] = deque(maxlen=window)
        self.total = 0.0
        self.count = 0


class QuantileSummary(Collector):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
        window: int = WINDOW,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.window = window
        self._series: dict[tuple[str, ...], _Series] = {}
        registry.register(self)

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        series = self._series.get(labels)
        if series is None:
            series = self._series[labels] = _Series(self.window)
        series.recent.append(value)
        series.total += value
        series.count += 1

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, "summary")
        for values, series in self._series.items():
            labels = dict(zip(self.labelnames, values, strict=True))
            ordered = sorted(series.recent)
            for q in QUANTILES:
                rank = max(0, math.ceil(q * len(ordered)) - 1)
                metric.add_sample(self.name, {**labels, "quantile": f"{q:g}"}, ordered[rank])
            metric.add_sample(self.name + "_sum", labels, series.total)
            metric.add_sample(self.name + "_count", labels, float(series.count))
        yield metric
