"""Router metrics in a per-app registry (several routers can share one process, e.g. in tests).

Labels stay bounded: ``target`` is a configured target id (or ``none`` when the router answered itself),
``route`` a known route or ``other``, ``status`` a class (2xx…5xx) or ``error`` (no response relayed).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

NO_TARGET = "none"
_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


def status_class(status: int) -> str:
    return f"{status // 100}xx"


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "progrouter_requests",
            "Requests answered, by target, route and status class.",
            ["target", "route", "status"],
            registry=registry,
        )
        self.duration = Histogram(
            "progrouter_request_duration_seconds",
            "Time from request arrival to the end of the relayed response.",
            ["target", "route"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self.upstream_errors = Counter(
            "progrouter_upstream_errors",
            "Attempts that got no usable answer from a worker (connection error, timeout, retryable status).",
            ["target", "kind"],
            registry=registry,
        )
        self.retries = Counter("progrouter_retries", "Requests re-sent to another target.", registry=registry)
        self.in_flight = Gauge(
            "progrouter_in_flight_requests",
            "Requests being forwarded, by target.",
            ["target"],
            registry=registry,
        )
        self.worker_healthy = Gauge(
            "progrouter_worker_healthy",
            "1 if the worker passes health checks.",
            ["worker"],
            registry=registry,
        )
        self._req_children: dict[tuple[str, str, str], Counter] = {}
        self._dur_children: dict[tuple[str, str], Histogram] = {}

    def observe(self, target: str, route: str, status: str, seconds: float) -> None:
        """One answered request; label children are cached because ``labels()`` is the slow part."""
        key = (target, route, status)
        counter = self._req_children.get(key)
        if counter is None:
            counter = self._req_children[key] = self.requests.labels(target, route, status)
        counter.inc()
        hkey = (target, route)
        hist = self._dur_children.get(hkey)
        if hist is None:
            hist = self._dur_children[hkey] = self.duration.labels(target, route)
        hist.observe(seconds)
