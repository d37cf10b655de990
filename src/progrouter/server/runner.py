"""Start and stop a router (and its Prometheus endpoint) inside a running event loop.

``stop`` gives requests still in progress ``STOP_GRACE_SECONDS`` before cutting them off; a graceful stop
drains first (``drain.drain``), which is what `progrouter serve` does on SIGTERM.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry

from progrouter.config import RouterConfig
from progrouter.server.app import build_app
from progrouter.server.dashboard.routes import install_metrics_dashboard
from progrouter.server.edge.connection import ConnectionGuard, GuardedSite
from progrouter.server.front import FrontDoor, FrontSite
from progrouter.server.state import REGISTRY_KEY, STATE_KEY, RouterState
from progrouter.server.status import metrics_app

STOP_GRACE_SECONDS = 1.0


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass
class RunningRouter:
    """A router serving on ``url``; Prometheus on ``metrics_url`` (None when disabled)."""

    url: str
    metrics_url: str | None
    app: web.Application
    _runners: list[web.AppRunner] = field(default_factory=list)

    @property
    def registry(self) -> CollectorRegistry:
        return self.app[REGISTRY_KEY]

    @property
    def state(self) -> RouterState:
        return self.app[STATE_KEY]

    @property
    def front_door(self) -> FrontDoor | None:
        """The router listener's front door (None with ``front_door`` off)."""
        sites = self._runners[0].sites if self._runners else []
        return next((site.door for site in sites if isinstance(site, FrontSite)), None)

    async def stop(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()


async def _serve(
    app: web.Application, host: str, port: int, guard: ConnectionGuard, front: RouterConfig | None = None
) -> tuple[web.AppRunner, int]:
    """``app`` on ``host:port``; with ``front`` (the router's config), behind the front door."""
    # handler_cancellation: a client that disconnects cancels its handler, which aborts the upstream call.
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=STOP_GRACE_SECONDS
    )
    await runner.setup()
    try:
        site = (
            GuardedSite(runner, host, port, guard)
            if front is None
            else FrontSite(runner, host, port, guard, front, grace=STOP_GRACE_SECONDS)
        )
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1]
    return runner, int(bound)


async def start_router(config: RouterConfig, *, workers_start_healthy: bool = True) -> RunningRouter:
    """Build and start the router described by ``config`` (port 0 picks a free port).

    ``workers_start_healthy=False``: no worker takes traffic until it answered a health check (``serve``).
    """
    app = build_app(config, workers_start_healthy=workers_start_healthy)
    guard = ConnectionGuard(config)
    runner, port = await _serve(app, config.host, config.port, guard, config if config.front_door else None)
    running = RunningRouter(_url(config.host, port), None, app, [runner])
    if config.prometheus_port is not None:
        try:
            m_app = metrics_app(app[REGISTRY_KEY])
            if config.dashboard == "prometheus":
                install_metrics_dashboard(m_app, app, config)
            m_runner, m_port = await _serve(m_app, config.prometheus_host, config.prometheus_port, guard)
        except BaseException:
            await running.stop()
            raise
        running._runners.append(m_runner)
        running.metrics_url = _url(config.prometheus_host, m_port) + "/metrics"
    return running
