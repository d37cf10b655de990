"""The EPP's own metrics: what it decided for each request Envoy asked about, and the ext_proc messages
it answered by phase (bounded labels)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

PHASES = (
    "request_headers",
    "request_body",
    "request_trailers",
    "response_headers",
    "response_body",
    "response_trailers",
)


class EppMetrics:
    """``progrouter_epp_decisions_total{decision}``: ``program``, ``native`` or ``refused_<status>``;
    ``progrouter_epp_messages_total{phase}``: the ext_proc messages Envoy sent, one of ``PHASES``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "progrouter_epp_decisions_total",
            "Requests the endpoint picker routed (program, native) or answered itself (refused_<status>)",
            ["decision"],
            registry=registry,
        )
        self._children = {d: self.decisions.labels(d) for d in ("program", "native")}
        messages = Counter(
            "progrouter_epp_messages_total",
            "ext_proc messages Envoy sent the endpoint picker, by phase (what the processing mode shows it)",
            ["phase"],
            registry=registry,
        )
        self._phases = {phase: messages.labels(phase) for phase in PHASES}

    def received(self, phase: str | None) -> None:
        child = self._phases.get(phase or "")
        if child is not None:
            child.inc()

    def decided(self, decision: str) -> None:
        child = self._children.get(decision)
        if child is None:  # a refusal: statuses are the scheduler's few (400, 413, 429, 500, 503)
            child = self._children[decision] = self.decisions.labels(decision)
        child.inc()
