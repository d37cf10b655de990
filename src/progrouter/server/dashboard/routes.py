"""The live dashboard: ``GET /dashboard`` (a static page shipped in the package) and
``GET /dashboard/stream`` (Server-Sent Events).

Each push carries the Rank aggregates, one page of the Programs table and the scheduling events since the
previous push, from a ``Summary`` built at most once per interval and shared by every viewer. The page asks
for its page with query parameters (``page``, ``size``, ``state``) and reconnects to change it. The routes
are admin routes (``server/edge/auth.py``), like the diagnostics; the page reads the stream with ``fetch`` so
it can send an ``Authorization`` header.
"""

from __future__ import annotations

import asyncio
import time
from importlib import resources
from typing import Any

import orjson
from aiohttp import web

from progrouter.config import RouterConfig
from progrouter.server.dashboard.summary import STATES, Summary
from progrouter.server.edge.auth import AccessPolicy, access_control
from progrouter.server.edge.errors import json_error
from progrouter.server.state import STATE_KEY, RouterState

INTERVAL_SECONDS = 0.5
FIRST_EVENTS = 100  # events a new viewer starts with
ASSETS = {
    "index.html": "text/html",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}


class DashboardHub:
    """The shared summary and the open streams of one router (closed when the router shuts down)."""

    def __init__(self, state: RouterState) -> None:
        self.state = state
        self.stopping = asyncio.Event()
        self._summary: Summary | None = None
        self._built_at = float("-inf")

    def summary(self) -> Summary | None:
        gate = self.state.gate
        if gate is None:
            return None
        now = time.monotonic()
        if self._summary is None or now - self._built_at >= INTERVAL_SECONDS / 2:
            self._summary, self._built_at = gate.summary(), now
        return self._summary

    def push(self, page: int, size: int, state: str | None, after: int) -> tuple[dict[str, Any], int]:
        """One push for a viewer that has seen events up to ``after``; returns it and the new mark."""
        gate = self.state.gate
        summary = self.summary()
        if gate is None or summary is None:
            return {"time": time.time(), "enabled": False}, after
        events = gate.feed.since(after)
        return {
            "time": time.time(),
            "enabled": True,
            "programs": summary.programs,
            "retained_requests": summary.retained_requests,
            "counts": summary.counts(),
            "ranks": summary.ranks,
            "page": summary.page(page, size, state),
            "events": events,
        }, gate.feed.last_seq


HUB_KEY = web.AppKey("dashboard_hub", DashboardHub)


def _int(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not raw.isdigit():
        raise web.HTTPBadRequest(text=f"{name} must be a non-negative integer")
    return int(raw)


async def handle_asset(request: web.Request) -> web.StreamResponse:
    name = request.match_info.get("name") or "index.html"
    content_type = ASSETS.get(name)
    if content_type is None:
        return json_error(404, f"no dashboard file {name!r}")
    body = resources.files("progrouter.server.dashboard").joinpath(name).read_bytes()
    return web.Response(body=body, content_type=content_type, headers={"Cache-Control": "no-cache"})


async def handle_stream(request: web.Request) -> web.StreamResponse:
    hub = request.app[HUB_KEY]
    try:
        page, size = _int(request, "page", 0), _int(request, "size", 50)
    except web.HTTPBadRequest as exc:
        return json_error(400, exc.text or "bad query")
    state = request.query.get("state") or None
    if state is not None and state not in STATES:
        return json_error(400, f"state must be one of {', '.join(STATES)}")
    gate = hub.state.gate
    after = 0 if gate is None else max(0, gate.feed.last_seq - FIRST_EVENTS)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    while not (hub.stopping.is_set() or hub.state.draining):  # a drain never waits on a viewer
        payload, after = hub.push(page, size, state, after)
        await response.write(b"data: " + orjson.dumps(payload) + b"\n\n")
        try:
            await asyncio.wait_for(hub.stopping.wait(), INTERVAL_SECONDS)
        except TimeoutError:
            continue
    return response


def install_dashboard(app: web.Application, router: web.Application) -> None:
    """Serve the dashboard on ``app`` (the router's own application, or the Prometheus listener's)."""
    hub = DashboardHub(router[STATE_KEY])
    app[HUB_KEY] = hub

    async def stop_streams(_app: web.Application) -> None:
        hub.stopping.set()

    app.on_shutdown.append(stop_streams)
    app.router.add_get("/dashboard", handle_asset)
    app.router.add_get("/dashboard/stream", handle_stream)
    app.router.add_get("/dashboard/{name}", handle_asset)


def install_metrics_dashboard(app: web.Application, router: web.Application, config: RouterConfig) -> None:
    """The dashboard on the Prometheus listener, behind the same access rule as on the router's."""
    app.middlewares.append(access_control(AccessPolicy.from_config(config)))
    install_dashboard(app, router)
