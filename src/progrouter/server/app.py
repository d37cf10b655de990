"""The aiohttp application: routes, and the lifecycle of the worker connections, health checks and the gate.

The proxied requests go through the proxy's ``WorkerClient``; the aiohttp session serves the hops that are
not hot (health checks, the /metrics poller, ``/v1/models`` and the admin fan-outs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry

from progrouter.config import RouterConfig
from progrouter.observe.kv_events import kv_events_context
from progrouter.routing.kv_aware import KvAwarePolicy
from progrouter.server.admin import add_admin_routes
from progrouter.server.dashboard.routes import install_dashboard
from progrouter.server.edge.errors import json_error, json_response
from progrouter.server.edge.limiter import InboundLimiter
from progrouter.server.edge.middleware import install_edge
from progrouter.server.gate.contract import build_program_gate
from progrouter.server.hop.circuit_breaker import Breakers, BreakerSettings, BreakerState
from progrouter.server.hop.retry import RetryPolicy
from progrouter.server.hop.worker_client import WorkerClient
from progrouter.server.prefix_index import evict_periodically
from progrouter.server.proxy import PROXIED_ROUTES, PROXY_KEY, AvailableTargetsGate, Proxy, handle_post
from progrouter.server.state import (
    CONFIG_KEY,
    REGISTRY_KEY,
    STATE_KEY,
    RouterState,
    attach_health_checker,
    build_state,
)
from progrouter.server.status import add_status_routes

log = logging.getLogger("progrouter.router")


async def handle_models(request: web.Request) -> web.Response:
    """The union of the healthy workers' models, first occurrence of each id wins."""
    state = request.app[STATE_KEY]
    session = state.session
    assert session is not None
    workers = sorted({t.base_url for t in state.candidates})
    timeout = aiohttp.ClientTimeout(total=state.config.health_check_timeout_secs)
    authorization = request.headers.get("Authorization")  # set by access control, never the bare worker key
    forwarded = {} if authorization is None else {"Authorization": authorization}

    async def fetch(worker: str) -> Any:
        async with session.get(
            worker + "/v1/models", headers=forwarded, timeout=timeout, allow_redirects=False
        ) as r:
            r.raise_for_status()
            return orjson.loads(await r.read())

    results = await asyncio.gather(*(fetch(w) for w in workers), return_exceptions=True)
    data: list[Any] = []
    seen: set[str] = set()
    answered = False
    for worker, result in zip(workers, results, strict=True):
        if isinstance(result, BaseException):
            log.info("GET /v1/models from %s failed: %r", worker, result)
            continue
        answered = True
        for model in result.get("data", []) if isinstance(result, dict) else []:
            model_id = model.get("id") if isinstance(model, dict) else None
            if isinstance(model_id, str) and model_id not in seen:
                seen.add(model_id)
                data.append(model)
    if not answered:
        return json_error(503, "no healthy worker answered /v1/models")
    return json_response({"object": "list", "data": data})


async def _not_found(request: web.Request) -> web.Response:
    return json_error(404, f"no route for {request.method} {request.path}")


def _log_calibration_warning(warning: dict[str, Any]) -> None:
    """WARN ``event=program_scheduling_reference_calibration``, in the Program event log format."""
    fields = {k: v for k, v in warning.items() if k != "event"}
    text = "".join(
        f" {k}={orjson.dumps(v).decode() if isinstance(v, list | dict) else v}" for k, v in fields.items()
    )
    logging.getLogger("progrouter.program").warning(
        "event=%s%s", warning["event"], text, extra={"event": warning["event"], "fields": fields}
    )


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE_KEY]
    config = state.config
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    state.session = aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=config.request_timeout_secs),
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding",),
        # No cookie store: a worker's Set-Cookie is relayed to its client, never replayed to the worker on
        # other clients' requests (upstream's HTTP client keeps none either), and nothing to match per
        # request.
        cookie_jar=aiohttp.DummyCookieJar(),
    )
    if config.program_scheduling is not None:
        warning = config.program_scheduling.reference_calibration_warning()
        if warning is not None:
            _log_calibration_warning(warning)
        gate = build_program_gate(config, state.session, app[REGISTRY_KEY], state.cache_index, state.kv_aware)
        state.gate = AvailableTargetsGate(gate, app[PROXY_KEY])
    state.refresh_candidates()
    if state.gate is not None:
        await state.gate.start()
    checker = attach_health_checker(state)
    tasks = [asyncio.create_task(checker.run(), name="progrouter-health")]
    if state.cache_index is not None:
        tasks.append(
            asyncio.create_task(
                evict_periodically(state.cache_index, config.eviction_interval_secs),
                name="progrouter-eviction",
            )
        )
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if state.gate is not None:
            await state.gate.stop()
        await state.session.close()
        await app[PROXY_KEY].workers.close()


def _proxy(config: RouterConfig, state: RouterState) -> Proxy:
    """The proxy's retry settings, breakers and limiter; breaker changes also reach the Program gate.

    Program placement uses available targets only (healthy, circuit not open), as upstream's scheduler
    does: a circuit that opens fails its Programs over, and the target is offered again once the open
    timeout has passed (half-open).
    """
    metrics = state.metrics
    offering = False

    def offer_program_targets() -> None:
        nonlocal offering
        if state.gate is None or offering:
            return
        offering = True  # judging availability may itself turn an open breaker half-open
        try:
            state.gate.set_healthy_targets(state.candidates)  # an AvailableTargetsGate: it filters
        finally:
            offering = False

    def offer_when_half_open(worker: str) -> None:
        """Offer an open circuit's Rank again once its timeout has passed. A loop timer may fire early —
        uvloop keeps time in whole milliseconds, so by up to 1 ms on ``time.monotonic`` — and the breaker,
        asked a moment too soon, stays open with nothing left to ask it again: so re-arm until it may."""
        left = breakers.seconds_until_half_open(worker, time.monotonic())
        if left > 0:
            asyncio.get_running_loop().call_later(left, offer_when_half_open, worker)
        else:
            offer_program_targets()

    def transition(worker: str, before: BreakerState, after: BreakerState) -> None:
        metrics.cb_state.labels(worker).set(int(after))
        metrics.cb_transitions.labels(worker, before.label, after.label).inc()
        log.warning("circuit breaker of %s: %s -> %s", worker, before.label, after.label)
        if after is BreakerState.OPEN and state.gate is not None:  # armed first: the offer may raise
            asyncio.get_running_loop().call_later(
                config.cb_timeout_duration_secs, offer_when_half_open, worker
            )
        offer_program_targets()

    breakers = Breakers(
        BreakerSettings.from_config(config), enabled=config.circuit_breaker_enabled, on_transition=transition
    )
    workers = WorkerClient(config.request_timeout_secs)
    return Proxy(RetryPolicy.from_config(config), breakers, InboundLimiter.from_config(config), workers)


def build_app(
    config: RouterConfig, registry: CollectorRegistry | None = None, *, workers_start_healthy: bool = True
) -> web.Application:
    """The router as an aiohttp app; run it with ``handler_cancellation=True`` (see ``runner``).

    ``workers_start_healthy=False`` is `serve`'s startup wait: no worker takes traffic (and ``/readiness``
    says 503) until one answers its health endpoint.
    """
    registry = registry if registry is not None else CollectorRegistry()
    state = build_state(config, registry, workers_start_healthy=workers_start_healthy)
    app = web.Application(client_max_size=config.max_payload_size)
    app[STATE_KEY] = state
    app[PROXY_KEY] = _proxy(config, state)
    for target in state.targets:
        state.metrics.cb_state.labels(target.id).set(0)
    install_edge(app, config, state)
    app[REGISTRY_KEY] = registry
    app[CONFIG_KEY] = config
    add_status_routes(app)
    app.router.add_get("/v1/models", handle_models)
    add_admin_routes(app)
    if config.dashboard == "router":
        install_dashboard(app, app)
    for route in sorted(PROXIED_ROUTES):
        app.router.add_post(route, handle_post)
    app.router.add_route("*", "/{tail:.*}", _not_found)
    app.cleanup_ctx.append(_lifecycle)
    if isinstance(state.policy, KvAwarePolicy):  # kv_aware's event subscribers (observe/kv_events.py)
        app.cleanup_ctx.append(kv_events_context(state.policy, config, registry))
    return app
