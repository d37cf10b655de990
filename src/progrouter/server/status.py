"""The router's status routes (health, readiness, liveness, Program diagnostics) and its /metrics app.

They read only ``RouterState`` (no proxy), so every shell that keeps one serves the same answers: `serve`
on its own port, `epp` on its admin port.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from progrouter.server.edge.errors import json_error, json_response
from progrouter.server.state import STATE_KEY


async def handle_health(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    unhealthy = state.health.unhealthy()
    if unhealthy:
        return json_response({"status": "unhealthy", "unhealthy_workers": unhealthy}, status=503)
    return json_response({"status": "healthy", "message": "All servers healthy"})


async def handle_readiness(request: web.Request) -> web.Response:
    """Upstream's shape; not ready while no worker is healthy (e.g. during the startup wait) or draining."""
    state = request.app[STATE_KEY]
    total = len(state.targets)  # upstream counts DP Ranks as workers
    if state.draining:
        reason = "router is shutting down"
    elif not state.candidates:
        reason = "no healthy workers available"
    else:
        return json_response(
            {"status": "ready", "healthy_workers": len(state.candidates), "total_workers": total}
        )
    return json_response({"status": "not_ready", "reason": reason, "total_workers": total}, status=503)


async def handle_liveness(request: web.Request) -> web.Response:
    return json_response({"status": "alive"})


async def handle_diagnostics(request: web.Request) -> web.Response:
    """The Program snapshot, one page of Programs: ``?offset=N&limit=M`` (limit capped by the scheduler)."""
    gate = request.app[STATE_KEY].gate
    if gate is None:
        return json_error(404, "Program scheduling is not enabled")
    page: dict[str, int] = {}
    for name in ("offset", "limit"):
        raw = request.query.get(name)
        if raw is None:
            continue
        if not raw.isdigit() or len(raw) > 9:
            return json_error(400, f"{name} must be a non-negative integer")
        page[name] = int(raw)
    return json_response(gate.diagnostics(**page))


def add_status_routes(app: web.Application) -> None:
    """``/health``, ``/readiness``, ``/liveness`` and ``/scheduling/diagnostics`` on ``app``."""
    app.router.add_get("/health", handle_health)
    app.router.add_get("/readiness", handle_readiness)
    app.router.add_get("/liveness", handle_liveness)
    app.router.add_get("/scheduling/diagnostics", handle_diagnostics)


def metrics_app(registry: CollectorRegistry) -> web.Application:
    async def handle(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    app.router.add_get("/", handle)
    return app
