"""The EPP's own metric: what it decided for each request Envoy asked about (bounded labels)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class EppMetrics:
    """``progrouter_epp_decisions_total{decision}``: ``program``, ``native`` or ``refused_<status>``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "progrouter_epp_decisions_total",
            "Requests the endpoint picker routed (program, native) or answered itself (refused_<status>)",
            ["decision"],
            registry=registry,
        )
        self._children = {d: self.decisions.labels(d) for d in ("program", "native")}

    def decided(self, decision: str) -> None:
        child = self._children.get(decision)
        if child is None:  # a refusal: statuses are the scheduler's few (400, 413, 429, 500, 503)
            child = self._children[decision] = self.decisions.labels(decision)
        child.inc()
