"""Counters, gauges and histograms whose series are plain numbers, rendered as prometheus_client renders its
own.

prometheus_client's ``Counter.inc``, ``Gauge.set`` and ``Histogram.observe`` take a lock per value (a
histogram: its sum and a bucket) behind a few checks and method calls, and a Program request makes about a
dozen of them. Every update happens on the event
loop, and so does every scrape (``/metrics`` and the tests' ``get_sample_value`` collect on the caller's
thread), so a series needs no lock: it is a float, or a list of bucket counts and a sum, updated in place.
At scrape each family yields the ``Metric`` prometheus_client's own family would (same name, type, help,
samples in the same order, series in first-use order), so the exposition is byte for byte the same.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

INF = float("inf")


class CounterSeries:
    """One labelled series of a ``LocalCounter``."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class GaugeSeries:
    """One labelled series of a ``LocalGauge``."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)


class HistogramSeries:
    """One labelled series of a ``LocalHistogram``: a count per bucket (not cumulative) and the sum."""

    __slots__ = ("_bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        assert bounds[-1] == INF
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.total = 0.0

    def observe(self, amount: float) -> None:
        """As prometheus_client's: the sum grows by ``amount``, and the first bucket whose bound is not below
        it counts it. The last bound is +Inf, so ``bisect_left`` always names a bucket; only NaN, which
        compares below nothing (and lands at 0), is not counted."""
        self.total += amount
        bounds = self._bounds
        index = bisect_left(bounds, amount)
        if amount <= bounds[index]:
            self.counts[index] += 1


Series = TypeVar("Series", CounterSeries, GaugeSeries, HistogramSeries)


class _Family(Collector, Generic[Series]):
    """A labelled family registered with ``registry``; its series are made on first use (without label
    names it is one series, there from the start)."""

    kind = ""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], Series] = {}
        if not self.labelnames:
            self._series[()] = self._new_series()
        registry.register(self)

    def _new_series(self) -> Series:
        raise NotImplementedError

    def describe(self) -> Iterable[Metric]:
        """The family's names, so the registry refuses a duplicate as it does prometheus_client's."""
        return [Metric(self.name, self.documentation, self.kind)]

    def labels(self, *values: object) -> Series:
        key = self._label_values(values)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = self._new_series()
        return series

    def _label_values(self, values: Sequence[object]) -> tuple[str, ...]:
        if len(values) != len(self.labelnames):
            raise ValueError("Incorrect label count")
        return tuple(str(value) for value in values)


class LocalCounter(_Family[CounterSeries]):
    """A counter family (``name`` without ``_total``; its samples are ``<name>_total``)."""

    kind = "counter"

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames, registry)

    def _new_series(self) -> CounterSeries:
        return CounterSeries()

    def inc(self, amount: float = 1.0) -> None:
        """An increment of the family without labels."""
        self._series[()].inc(amount)

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        for values, series in self._series.items():
            labels = dict(zip(self.labelnames, values, strict=True))
            metric.add_sample(self.name + "_total", labels, series.value)
        return [metric]


class LocalGauge(_Family[GaugeSeries]):
    """A gauge family whose series are set; a series removed and set again comes back last, as in
    prometheus_client."""

    kind = "gauge"

    def _new_series(self) -> GaugeSeries:
        return GaugeSeries()

    def remove(self, *values: object) -> None:
        """Drop one series (nothing when it does not exist)."""
        self._series.pop(self._label_values(values), None)

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        for values, series in self._series.items():
            metric.add_sample(self.name, dict(zip(self.labelnames, values, strict=True)), series.value)
        return [metric]


class LocalHistogram(_Family[HistogramSeries]):
    """A histogram family with fixed buckets (``+Inf`` added last, as prometheus_client does)."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
        buckets: Sequence[float],
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds[-1] != INF:
            bounds.append(INF)
        self._bounds = tuple(bounds)
        self._les = tuple(floatToGoString(b) for b in bounds)  # type: ignore[no-untyped-call]
        super().__init__(name, documentation, labelnames, registry)

    def _new_series(self) -> HistogramSeries:
        return HistogramSeries(self._bounds)

    def observe(self, amount: float) -> None:
        """An observation of the family without labels."""
        self._series[()].observe(amount)

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        for values, series in self._series.items():
            labels = dict(zip(self.labelnames, values, strict=True))
            cumulative = 0.0
            for le, count in zip(self._les, series.counts, strict=True):
                cumulative += count
                metric.add_sample(self.name + "_bucket", {**labels, "le": le}, cumulative)
            metric.add_sample(self.name + "_count", labels, cumulative)
            if self._bounds[0] >= 0:
                metric.add_sample(self.name + "_sum", labels, series.total)
        return [metric]
