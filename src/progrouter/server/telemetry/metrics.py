"""Router metrics: upstream vllm-router's ``vllm_router_*`` families, and our extras as ``progrouter_*``.

Names, types and labels are those a scrape of vllm-router 0.1.17 shows (``worker`` is a target id: the
worker URL, with ``@rank`` under intra-node data parallelism; ``route`` is a proxied route; ``attempt`` the
retry number), with upstream's meanings: ``requests_total`` and ``generate_duration_seconds`` count
successful answers, ``request_errors_total`` answers that failed without retry (``error_type``:
``non_retryable_error``, ``no_available_workers``, ``bad_request``, ``internal_error``), and
``retries_exhausted_total`` requests whose last attempt still failed. ``progrouter_requests_total`` counts
every answer by target, route and status class (or ``error`` when the client left first), so nothing is
lost in the gap between those upstream families. Every label is bounded: target ids are configured, routes
are an allow-list, the rest are enums. A registry per app lets several routers share a process (tests).
Counters and histograms are ``local_metrics`` families (plain numbers, no lock per update); gauges are
prometheus_client's.
"""

from __future__ import annotations

import contextlib
from typing import Any, overload

from prometheus_client import CollectorRegistry, Gauge, disable_created_metrics

from progrouter.server.telemetry.local_metrics import (
    CounterSeries,
    HistogramSeries,
    LocalCounter,
    LocalHistogram,
)

# Upstream exposes no ``*_created`` series; neither do we (a process-wide switch of prometheus_client).
disable_created_metrics()  # type: ignore[no-untyped-call]

NO_TARGET = "none"
# Upstream's duration buckets (seconds), as a scrape of generate_duration_seconds shows them.
DURATION_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0, 90.0, 120.0,
    180.0, 240.0,
)  # fmt: skip
_OUR_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


def status_class(status: int) -> str:
    return f"{status // 100}xx"


def _counter(name: str, doc: str, labels: tuple[str, ...], registry: CollectorRegistry) -> LocalCounter:
    return LocalCounter(name, doc, labels, registry)


def _histogram(
    name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...], registry: CollectorRegistry
) -> LocalHistogram:
    return LocalHistogram(name, doc, labels, registry, buckets)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        r = registry
        # ----------------------------------------------------------------------- upstream: requests
        self.requests_total = _counter(
            "vllm_router_requests_total", "Successful requests by route", ("route",), r
        )
        self.request_duration = _histogram(
            "vllm_router_request_duration_seconds",
            "Request duration by route, from arrival to the end of the answer",
            ("route",),
            DURATION_BUCKETS,
            r,
        )
        self.generate_duration = _histogram(
            "vllm_router_generate_duration_seconds",
            "Duration of successful requests",
            (),
            DURATION_BUCKETS,
            r,
        )
        self.request_errors = _counter(
            "vllm_router_request_errors_total", "Failed requests by route and error type",
            ("route", "error_type"), r,
        )  # fmt: skip
        # ------------------------------------------------------------------------ upstream: retries
        self.retries = _counter("vllm_router_retries_total", "Retry attempts by route", ("route",), r)
        self.retries_exhausted = _counter(
            "vllm_router_retries_exhausted_total", "Requests whose last attempt failed", ("route",), r
        )
        self.retry_backoff = _histogram(
            "vllm_router_retry_backoff_duration_seconds",
            "Backoff before each retry, by retry number",
            ("attempt",),
            DURATION_BUCKETS,
            r,
        )
        # ---------------------------------------------------------------- upstream: circuit breakers
        self.cb_state = Gauge(
            "vllm_router_cb_state", "Circuit breaker state (0 closed, 1 open, 2 half-open)", ("worker",),
            registry=r,
        )  # fmt: skip
        self.cb_transitions = _counter(
            "vllm_router_cb_state_transitions_total", "Circuit breaker transitions",
            ("worker", "from", "to"), r,
        )  # fmt: skip
        self.cb_outcomes = _counter(
            "vllm_router_cb_outcomes_total", "Attempt outcomes seen by the circuit breaker",
            ("worker", "outcome"), r,
        )  # fmt: skip
        # ------------------------------------------------------------------------ upstream: workers
        # set by RouterState.refresh_candidates; active_workers is a function of the candidates (app.py)
        self.worker_healthy = Gauge(
            "vllm_router_worker_health", "1 if the worker passes health checks", ("worker",), registry=r
        )
        self.active_workers = Gauge("vllm_router_active_workers", "Healthy workers", registry=r)
        self.worker_load = Gauge(
            "vllm_router_worker_load", "Requests in flight on the worker", ("worker",), registry=r
        )
        self.running_requests = Gauge(
            "vllm_router_running_requests", "Requests being forwarded to the worker", ("worker",), registry=r
        )
        self.processed_requests = _counter(
            "vllm_router_processed_requests_total", "Attempts sent to the worker", ("worker",), r
        )
        # ------------------------------------------------------------------------- upstream: policies
        self.policy_decisions = _counter(
            "vllm_router_policy_decisions_total", "Routing decisions by policy and worker",
            ("policy", "worker"), r,
        )  # fmt: skip
        self.cache_hits = _counter("vllm_router_cache_hits_total", "cache_aware prefix hits", (), r)
        self.cache_misses = _counter("vllm_router_cache_misses_total", "cache_aware prefix misses", (), r)
        self.tree_size = Gauge(
            "vllm_router_tree_size", "cache_aware prefix tree characters per worker", ("worker",), registry=r
        )
        self.load_balancing_events = _counter(
            "vllm_router_load_balancing_events_total", "cache_aware decisions made on load imbalance", (), r
        )
        self.max_load = Gauge("vllm_router_max_load", "Highest worker load at the last imbalance", registry=r)
        self.min_load = Gauge("vllm_router_min_load", "Lowest worker load at the last imbalance", registry=r)
        # ---------------------------------------------------------------------------------- ours
        self.answers = _counter(
            "progrouter_requests_total",
            "Every answer by target, route and status class (error: the client left first)",
            ("target", "route", "status"),
            r,
        )
        self.answer_duration = _histogram(
            "progrouter_request_duration_seconds",
            "Time from request arrival to the end of the relayed response, by target and route.",
            ("target", "route"),
            _OUR_BUCKETS,
            r,
        )
        self.upstream_errors = _counter(
            "progrouter_upstream_errors_total",
            "Attempts that got no usable answer (kind: connection, timeout, status)",
            ("target", "kind"),
            r,
        )
        self.inbound_rejections = _counter(
            "progrouter_inbound_rejections_total",
            "Requests refused by the inbound limit (reason: queue_full, queue_timeout)",
            ("reason",),
            r,
        )
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._targets: dict[str, TargetSeries] = {}
        self._answers: dict[tuple[str, str, str], AnswerSeries] = {}

    @overload
    def child(self, metric: LocalCounter, *labels: str) -> CounterSeries: ...
    @overload
    def child(self, metric: LocalHistogram, *labels: str) -> HistogramSeries: ...
    @overload
    def child(self, metric: Gauge, *labels: str) -> Gauge: ...
    def child(self, metric: LocalCounter | LocalHistogram | Gauge, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached: ``labels()`` is the slow part of a hot-path update."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def target(self, target_id: str) -> TargetSeries:
        """The series every attempt on ``target_id`` updates, bound once."""
        found = self._targets.get(target_id)
        if found is None:
            found = self._targets[target_id] = TargetSeries(
                (self.running_requests.labels(target_id), self.worker_load.labels(target_id)),
                self.processed_requests.labels(target_id),
                self.cb_outcomes.labels(target_id, "success"),
                self.cb_outcomes.labels(target_id, "failure"),
            )
        return found

    def forget_worker(self, worker: str) -> None:
        """A target left the configuration: drop its gauge series, so they do not report stale values
        forever, and their cached children, so a target added again later is visible again.
        Counters and histograms keep their history."""
        gauges = (self.cb_state, self.worker_healthy, self.worker_load, self.running_requests, self.tree_size)
        for gauge in gauges:
            with contextlib.suppress(KeyError):
                gauge.remove(worker)
        ids = {id(g) for g in gauges}
        self._children = {k: v for k, v in self._children.items() if not (k[0] in ids and k[1] == (worker,))}
        self._targets.pop(worker, None)

    def observe(self, target: str, route: str, status: str, seconds: float) -> None:
        """One answer to a client; ``status`` is its class (``2xx`` …) or ``error`` (the client left)."""
        series = self._answers.get((target, route, status))
        if series is None:
            series = self._answers[target, route, status] = self._answer_series(target, route, status)
        series.record(seconds)

    def _answer_series(self, target: str, route: str, status: str) -> AnswerSeries:
        durations = [self.answer_duration.labels(target, route), self.request_duration.labels(route)]
        success = None
        if status == "2xx":  # a successful request, as upstream's requests_total and generate_duration count
            success = self.requests_total.labels(route)
            durations.append(self.generate_duration.labels())
        return AnswerSeries(self.answers.labels(target, route, status), tuple(durations), success)


class AnswerSeries:
    """The series one kind of answer updates (by target, route and status class), bound once."""

    __slots__ = ("count", "durations", "success")

    def __init__(
        self, count: CounterSeries, durations: tuple[HistogramSeries, ...], success: CounterSeries | None
    ) -> None:
        self.count = count
        self.durations = durations
        self.success = success

    def record(self, seconds: float) -> None:
        self.count.inc()
        for duration in self.durations:
            duration.observe(seconds)
        if self.success is not None:
            self.success.inc()


class TargetSeries:
    """One target's per-attempt series, bound once (``labels()`` is the slow part of a hot-path update).

    ``running_requests`` and ``worker_load`` both count the attempts in flight on the target: one integer,
    read by both gauges when scraped, instead of two locked gauge updates each way on every attempt."""

    __slots__ = ("cb_failure", "cb_success", "in_flight", "processed")

    def __init__(
        self,
        in_flight_gauges: tuple[Gauge, ...],
        processed: CounterSeries,
        cb_success: CounterSeries,
        cb_failure: CounterSeries,
    ) -> None:
        self.in_flight = 0
        self.processed = processed
        self.cb_success = cb_success
        self.cb_failure = cb_failure
        for gauge in in_flight_gauges:
            gauge.set_function(self._in_flight)

    def _in_flight(self) -> int:
        return self.in_flight

    def started(self) -> None:
        """An attempt goes to the target."""
        self.processed.inc()
        self.in_flight += 1

    def finished(self, worker_ok: bool | None) -> None:
        """The attempt is over; ``worker_ok`` is what the circuit breaker hears (None: nothing to hear)."""
        self.in_flight -= 1
        if worker_ok is not None:
            (self.cb_success if worker_ok else self.cb_failure).inc()
