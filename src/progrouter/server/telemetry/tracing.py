"""Optional OpenTelemetry tracing (``--otlp-traces-endpoint``; ``pip install 'progrouter[otel]'``).

One span per proxied request (``progrouter.request``) carrying the scheduling decision as attributes: the
request id, ``native`` or ``program`` scheduling, the seconds spent waiting for admission (pooled time) and
the Rank that served it. The span's context goes to the worker as ``traceparent``, so vLLM's own tracing
(``--otlp-traces-endpoint`` on vLLM) joins the same trace. With tracing off (or OpenTelemetry not installed)
every function here is a cheap no-op.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from progrouter.config import ConfigError

SPAN_NAME = "progrouter.request"
_tracer: Any = None  # an opentelemetry Tracer once configured


def available() -> bool:
    return importlib.util.find_spec("opentelemetry.sdk") is not None


def configure(endpoint: str | None, exporter: Any = None) -> None:
    """Trace to the OTLP/HTTP ``endpoint`` (or into ``exporter``, e.g. the SDK's in-memory one for tests)."""
    global _tracer
    if endpoint is None and exporter is None:
        _tracer = None
        return
    if not available():
        raise ConfigError("otlp_traces_endpoint needs OpenTelemetry: pip install 'progrouter[otel]'")
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "progrouter"}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    _tracer = provider.get_tracer("progrouter")


_NO_SPAN = contextlib.nullcontext()


def request_span(
    route: str, request_id: str | None, headers: Mapping[str, str]
) -> contextlib.AbstractContextManager[None]:
    """The span of one proxied request (current for everything it does), a child of the client's
    ``traceparent`` when it sent one; with tracing off, one shared no-op context."""
    return _NO_SPAN if _tracer is None else _span(route, request_id, headers)


@contextlib.contextmanager
def _span(route: str, request_id: str | None, headers: Mapping[str, str]) -> Iterator[None]:
    from opentelemetry.propagate import extract

    attributes = {"progrouter.route": route, "progrouter.request_id": request_id or ""}
    with _tracer.start_as_current_span(SPAN_NAME, context=extract(headers), attributes=attributes):
        yield


def annotate(**attributes: str | int | float | bool) -> None:
    """Add the scheduling decision to the current request's span."""
    if _tracer is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes({f"progrouter.{k}": v for k, v in attributes.items()})


def inject(headers: MutableMapping[str, str]) -> None:
    """Add ``traceparent`` (W3C trace context) for the current span to the worker's request headers."""
    if _tracer is None:
        return
    from opentelemetry.propagate import inject as propagate

    propagate(headers)
