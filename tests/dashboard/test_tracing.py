"""OpenTelemetry tracing: one span per request with the scheduling decision, ``traceparent`` to the worker.

The SDK's in-memory exporter collects the spans; the worker is a small aiohttp server that records the
headers it was sent.
"""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dashboard.conftest import ProgramTurn
from progrouter.server.telemetry import tracing
from support.factories import RouterFactory
from support.loopback import serve_app

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.configure(None, exporter)
    yield exporter
    tracing.configure(None)


async def test_a_program_request_is_one_span_with_its_decision(
    spans: InMemorySpanExporter, program_turn: ProgramTurn
) -> None:
    engine, _ = await program_turn("traced", "rid-7")
    (span,) = [s for s in spans.get_finished_spans() if s.name == tracing.SPAN_NAME]
    attributes = dict(span.attributes or {})
    assert attributes["progrouter.request_id"] == "rid-7"
    assert attributes["progrouter.scheduling"] == "program"
    assert attributes["progrouter.rank"].startswith(engine.url)
    assert attributes["progrouter.pooled_seconds"] >= 0.0
    assert attributes["progrouter.status"] == 200


async def test_traceparent_reaches_the_worker_and_joins_the_clients_trace(
    spans: InMemorySpanExporter, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    seen: list[str | None] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.get("traceparent"))
        return web.json_response({"choices": []})

    app = web.Application()
    app.router.add_post("/v1/completions", answer)
    runner, url = await serve_app(app)
    try:
        router = await make_router([url])
        client_trace = "0af7651916cd43dd8448eb211c80319c"
        parent = f"00-{client_trace}-b7ad6b7169203331-01"
        async with client.post(
            router.url + "/v1/completions", json={"prompt": "hi"}, headers={"traceparent": parent}
        ) as response:
            assert response.status == 200
    finally:
        await runner.cleanup()
    (span,) = [s for s in spans.get_finished_spans() if s.name == tracing.SPAN_NAME]
    assert span.context is not None and span.parent is not None
    assert f"{span.context.trace_id:032x}" == client_trace
    assert dict(span.attributes or {})["progrouter.scheduling"] == "native"
    (sent,) = seen
    assert sent is not None
    assert sent.split("-")[1:3] == [client_trace, f"{span.context.span_id:016x}"]  # the router's span
