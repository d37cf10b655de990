"""Prometheus metrics and log events for Program scheduling: the live ``SchedulerObserver``.

Every metric of upstream §6.1 under ``vllm_router_agent_aware_<name>``, with upstream's types, labels and
histogram buckets, so dashboards and the spec's tuning workflow carry over unchanged. Labels are target ids
and bounded enums only; Program ids never reach a metric.

A name or label set that is not in the table below is a bug in the caller. Under tests (``strict``) it raises
at once; in a running router it is logged once and dropped, because metrics must never break scheduling.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from progrouter.program import InvalidIdentity, LogLevel, NoTargets, PoolFull, QueueTimeout, ScheduleError
from progrouter.server.telemetry.event_feed import EventFeed
from progrouter.server.telemetry.local_metrics import (
    CounterSeries,
    GaugeSeries,
    HistogramSeries,
    LocalCounter,
    LocalGauge,
    LocalHistogram,
)
from progrouter.server.telemetry.quantiles import QuantileSummary

PREFIX = "vllm_router_agent_aware_"

# Buckets exactly as upstream's ``set_program_scheduling_buckets`` (and its default duration buckets).
DURATION_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0, 90.0, 120.0,
    180.0, 240.0,
)  # fmt: skip
CACHE_MISS_SECONDS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
INTERVAL_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
ARMED_TTL_SECONDS = (0.0, *INTERVAL_SECONDS)
TOKEN_BUCKETS = (0.0, *(float(2**k) for k in range(7, 21)))  # 0, 128 … 1,048,576
RATIO_BUCKETS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0)
REQUEST_BUCKETS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)

TRANSITION_REASONS = frozenset(
    {
        "program_admit",
        "batch_gain_admit",
        "force_resume",
        "cross_rank_resume",
        "ttl_expired",
        "capacity_repair",
        "capacity_repair_mark",
        "max_segment_yield",
        "request_failed",
        "request_cancelled",
        "paused_retention_release",
        "health_failover",
    }
)
# Bounded enum labels: a value outside its set is a caller bug.
ENUM_LABELS: Mapping[str, frozenset[str]] = {
    "reason": TRANSITION_REASONS,
    "window": frozenset({"request", "continuity"}),
    "source": frozenset({"request_hint", "fitted", "fixed"}),
    "outcome": frozenset({"observed", "missing"}),
}

_T = ("target",)
_POOL = ("model_pool", "endpoint")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    kind: str  # gauge | counter | histogram | summary (a histogram upstream's exporter renders as a summary)
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()


METRICS: Mapping[str, MetricSpec] = {
    "rank_queue_size": MetricSpec(
        "gauge", "Queued Programs attributed to each Program-scheduling target", _T
    ),
    "rank_active_programs": MetricSpec("gauge", "Active Programs on each Program-scheduling target", _T),
    "transitions_total": MetricSpec(
        "counter", "Committed Program scheduling transitions by target and reason", ("target", "reason")
    ),
    "queue_wait_seconds": MetricSpec(
        "summary", "Time retained in the Program RequestPool before dispatch", _T
    ),
    "fitted_ttl_seconds": MetricSpec("gauge", "Representative fitted acting TTL by target", _T),
    "context_growth_tokens": MetricSpec("gauge", "Rolling mean Program context growth by target", _T),
    "rolling_samples": MetricSpec(
        "gauge", "Retained Program-scheduling samples by target and window", ("target", "window")
    ),
    "cache_miss_impact_rolling_mean_seconds": MetricSpec(
        "gauge", "Rolling mean cache-miss recovery impact by Program-scheduling target", _T
    ),
    "capacity_observation_fresh": MetricSpec(
        "gauge", "Whether backend capacity accounting is fresh and usable by target", _T
    ),
    "token_capacity_tokens": MetricSpec(
        "gauge", "Token capacity in force by target (0: none, the Program-count guard alone)", _T
    ),
    "token_estimate_coefficient": MetricSpec(
        "gauge", "Current prompt tokens-per-byte coefficient by model pool and endpoint", _POOL
    ),
    "residency_rule_total": MetricSpec(
        "counter", "Decisions residency_aware changed, by rule (program/residency.py)", ("rule",)
    ),
    "token_estimate_feedback_total": MetricSpec(
        "counter", "Prompt-token estimator feedback outcomes", (*_POOL, "outcome")
    ),
    "cache_miss_impact_seconds": MetricSpec(
        "histogram",
        "Estimated cache-miss recovery impact for completed Program requests",
        _T,
        CACHE_MISS_SECONDS,
    ),
    "request_interval_seconds": MetricSpec(
        "histogram", "Program request intervals used by the Progress-TTL fit", _T, INTERVAL_SECONDS
    ),
    "armed_ttl_seconds": MetricSpec(
        "histogram", "Final acting TTL armed after a Program request", ("target", "source"), ARMED_TTL_SECONDS
    ),
    "shared_prefix_observed_tokens": MetricSpec(
        "histogram",
        "Explicit cached-token observation used to refresh a Program shared prefix",
        _T,
        TOKEN_BUCKETS,
    ),
    "admission_used_tokens": MetricSpec(
        "histogram", "Managed target tokens before Program admission", _T, TOKEN_BUCKETS
    ),
    "admission_required_tokens": MetricSpec(
        "histogram", "Candidate tokens required by a committed Program admission", _T, TOKEN_BUCKETS
    ),
    "admission_growth_reserve_tokens": MetricSpec(
        "histogram", "Growth reserve included in a committed Program admission", _T, TOKEN_BUCKETS
    ),
    "admission_capacity_pressure_ratio": MetricSpec(
        "histogram", "Managed capacity pressure before Program admission", _T, RATIO_BUCKETS
    ),
    "admission_projected_pressure_ratio": MetricSpec(
        "histogram",
        "Projected capacity pressure after Program admission and growth reserve",
        _T,
        RATIO_BUCKETS,
    ),
    "admission_backend_kv_usage_ratio": MetricSpec(
        "histogram", "Backend KV usage observed at Program admission", _T, RATIO_BUCKETS
    ),
    "admission_backend_running_requests": MetricSpec(
        "histogram", "Backend running requests observed at Program admission", _T, REQUEST_BUCKETS
    ),
    "admission_backend_waiting_requests": MetricSpec(
        "histogram", "Backend waiting requests observed at Program admission", _T, REQUEST_BUCKETS
    ),
    "admission_capacity_observation_age_seconds": MetricSpec(
        "histogram", "Age of the backend capacity observation at Program admission", _T, INTERVAL_SECONDS
    ),
}

#: Why Program scheduling refused a request (``progrouter_program_rejections_total{reason}``); any other
#: ``ScheduleError`` (the drain's) counts as ``draining``.
REJECTION_REASONS: Mapping[type[ScheduleError], str] = {
    PoolFull: "pool_full",  # 429: max_pooled_requests waiting already
    QueueTimeout: "queue_timeout",  # 429: waited past queue_timeout_seconds (or its deadline hint)
    InvalidIdentity: "invalid_identity",  # 400
    NoTargets: "no_targets",  # 503
}
OTHER_REJECTION = "draining"  # 503: the router is shutting down

_LEVELS: Mapping[str, int] = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


class UnknownMetric(LookupError):
    """A metric name, label set or enum label value that §6.1 does not define."""


class _Fields:
    """Formats event fields only if the record is emitted."""

    __slots__ = ("fields",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.fields = fields

    def __str__(self) -> str:
        return "".join(f" {key}={_format(value)}" for key, value in self.fields.items())


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    text = str(value)
    return text if text and " " not in text else repr(text)


def _dropped(_value: float) -> None:
    """The update of a series that is not in the table (already reported by ``_unknown``)."""


class PrometheusObserver:
    """``SchedulerObserver`` that records into a Prometheus registry and logs events via ``logging``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        strict: bool | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.strict = "pytest" in sys.modules if strict is None else strict
        self.log = logger or logging.getLogger("progrouter.program")
        self.feed = EventFeed()  # what the dashboard and ``progrouter top`` show
        self._metrics: dict[str, LocalGauge | LocalCounter | LocalHistogram | QuantileSummary] = {}
        self._gauge_series: dict[str, set[tuple[str, ...]]] = {}
        self._complained: set[str] = set()
        # The hot-path cache (a Program request records a dozen series): per name, kind and label set already
        # checked, the bound update of its labelled series (``labels()`` and the checks are the slow part of
        # an update). Bounded as the series are.
        self._updates: dict[tuple[str, str, tuple[tuple[str, str], ...]], Callable[[float], None]] = {}
        for name, spec in METRICS.items():
            full = PREFIX + name
            metric: LocalGauge | LocalCounter | LocalHistogram | QuantileSummary
            if spec.kind == "summary":
                metric = QuantileSummary(full, spec.help, spec.labels, registry)
            elif spec.kind == "gauge":
                metric = LocalGauge(full, spec.help, spec.labels, registry)
                self._gauge_series[name] = set()
            elif spec.kind == "counter":
                metric = LocalCounter(full, spec.help, spec.labels, registry)
            else:
                metric = LocalHistogram(full, spec.help, spec.labels, registry, spec.buckets)
            self._metrics[name] = metric
        # Ours, beside upstream's table: every reason's series exists from the start (at 0).
        rejections = LocalCounter(
            "progrouter_program_rejections_total",
            "Requests Program scheduling refused, by reason (pool_full and queue_timeout answer 429)",
            ("reason",),
            registry,
        )
        reasons = (*REJECTION_REASONS.values(), OTHER_REJECTION)
        self._rejections = {reason: rejections.labels(reason) for reason in reasons}

    # ---------------------------------------------------------------------------------- SchedulerObserver
    def transition(self, target: str, reason: str) -> None:
        self.counter("transitions_total", 1.0, target=target, reason=reason)
        self.feed.transition(target, reason)

    # Each looks its bound update up itself (a dozen per Program request): ``_update`` is the miss.
    def histogram(self, name: str, value: float, **labels: str) -> None:
        update = self._updates.get((name, "histogram", tuple(labels.items())))
        (update or self._update(name, "histogram", labels))(value)

    def gauge(self, name: str, value: float, **labels: str) -> None:
        update = self._updates.get((name, "gauge", tuple(labels.items())))
        (update or self._update(name, "gauge", labels))(value)

    def counter(self, name: str, amount: float = 1.0, **labels: str) -> None:
        update = self._updates.get((name, "counter", tuple(labels.items())))
        (update or self._update(name, "counter", labels))(amount)

    def event(self, level: LogLevel, name: str, **fields: Any) -> None:
        self.feed.event(name, fields)
        numeric = _LEVELS.get(level)
        if numeric is None:
            self._unknown(f"log level {level!r} of event {name}")
            numeric = logging.INFO
        if self.log.isEnabledFor(numeric):
            self.log.log(
                numeric, "event=%s%s", name, _Fields(fields), extra={"event": name, "fields": fields}
            )

    def wants_debug(self) -> bool:
        """Debug events only go to the log (the feed shows none), so only a logger enabled for them does."""
        return self.log.isEnabledFor(logging.DEBUG)

    def rejected(self, error: ScheduleError) -> None:
        """Count a refused request by its reason (a bounded label: the kind of error, never its text)."""
        self._rejections[REJECTION_REASONS.get(type(error), OTHER_REJECTION)].inc()

    # ------------------------------------------------------------------------------------------ lifecycle
    def forget_target(self, target: str) -> None:
        """Drop the gauge series of a Rank that left, so it does not report its last values forever."""
        for name, series in self._gauge_series.items():
            index = METRICS[name].labels.index("target") if "target" in METRICS[name].labels else None
            if index is None:
                continue
            metric = self._metrics[name]
            assert isinstance(metric, LocalGauge)
            for values in [v for v in series if v[index] == target]:
                metric.remove(*values)
                series.discard(values)
        self._updates.clear()  # forget the departed Rank's bound series too

    # -------------------------------------------------------------------------------------------- checks
    def _update(self, name: str, kind: str, labels: Mapping[str, str]) -> Callable[[float], None]:
        """The bound update of one series (observe, set or inc), once name, kind and labels are checked."""
        key = (name, kind, tuple(labels.items()))
        update = self._updates.get(key)
        if update is None:
            update = self._bind(name, kind, labels)
            if update is not _dropped:  # only table series are kept: the cache stays as bounded as they are
                self._updates[key] = update
        return update

    def _bind(self, name: str, kind: str, labels: Mapping[str, str]) -> Callable[[float], None]:
        values = self._check(name, kind, labels)
        if values is None:
            return _dropped
        metric = self._metrics[name]
        if type(metric) is QuantileSummary:  # not isinstance: a Protocol subclass, slow to check
            return functools.partial(metric.observe, values)
        assert not isinstance(metric, QuantileSummary)
        child = metric.labels(*values)
        if isinstance(child, HistogramSeries):
            return child.observe
        if isinstance(child, GaugeSeries):
            self._gauge_series[name].add(values)
            return child.set
        assert isinstance(child, CounterSeries)
        return child.inc

    def _check(self, name: str, kind: str, labels: Mapping[str, str]) -> tuple[str, ...] | None:
        spec = METRICS.get(name)
        if spec is None or ("histogram" if spec.kind == "summary" else spec.kind) != kind:
            self._unknown(f"{kind} {name!r}")
            return None
        if set(labels) != set(spec.labels):
            self._unknown(f"labels {sorted(labels)} of {name} (expected {list(spec.labels)})")
            return None
        for key, value in labels.items():
            allowed = ENUM_LABELS.get(key)
            if allowed is not None and value not in allowed:
                self._unknown(f"{key}={value!r} of {name}")
                return None
        return tuple(str(labels[key]) for key in spec.labels)

    def _unknown(self, what: str) -> None:
        if self.strict:
            raise UnknownMetric(f"Program scheduling metric not in §6.1: {what}")
        if what not in self._complained:
            self._complained.add(what)
            self.log.warning("dropping unknown Program scheduling metric: %s", what)
