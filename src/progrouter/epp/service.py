"""`progrouter epp` running: the ext_proc gRPC server, the state it decides with, and its HTTP listeners.

What `serve` keeps, minus the proxy: the worker set and its health checks, the native policy and the shared
prefix index, the Program gate (scheduler, driver, backend observation). On top: a grpc.aio server for
Envoy's ext_proc stream, an admin HTTP listener (health, readiness, liveness, diagnostics, dashboard) and
the Prometheus ``/metrics`` listener.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from prometheus_client import CollectorRegistry

from progrouter.config import RouterConfig
from progrouter.epp.counter_usage import CounterUsage
from progrouter.epp.exchange import Exchange
from progrouter.epp.health import health_handler
from progrouter.epp.metrics import EppMetrics
from progrouter.server.dashboard.routes import install_dashboard
from progrouter.server.edge.auth import AccessPolicy, access_control
from progrouter.server.edge.errors import json_errors
from progrouter.server.gate.contract import build_program_gate
from progrouter.server.prefix_index import evict_periodically
from progrouter.server.state import (
    CONFIG_KEY,
    REGISTRY_KEY,
    STATE_KEY,
    RouterState,
    attach_health_checker,
    build_state,
)
from progrouter.server.status import add_status_routes, metrics_app

STOP_GRACE_SECONDS = 1.0


class Processor(ext_proc_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """The ext_proc service: one ``Exchange`` per stream (per HTTP request Envoy forwards)."""

    # grpc.aio answers each message through the handler's ``context`` (``requests`` is left unread).

    def __init__(self, state: RouterState, metrics: EppMetrics, counters: CounterUsage | None) -> None:
        self._state = state
        self._metrics = metrics
        self._counters = counters

    async def Process(self, requests: AsyncIterator[Any], context: Any) -> None:
        """Read and answer Envoy's messages, one at a time. With grpc.aio's read/write calls rather than
        the request iterator and an answer generator: two async generators fewer per message."""
        exchange = Exchange(self._state, self._metrics, self._counters)
        try:
            while (message := await context.read()) is not grpc.aio.EOF:
                answer = await exchange.answer(message)
                await context.write(answer)
                if answer.HasField("immediate_response"):
                    return
        finally:
            exchange.close()


def admin_app(state: RouterState, registry: CollectorRegistry) -> web.Application:
    """Health, readiness, liveness, diagnostics and the dashboard, behind `serve`'s access rule."""
    config = state.config
    app = web.Application(middlewares=[json_errors, access_control(AccessPolicy.from_config(config))])
    app[STATE_KEY] = state
    app[REGISTRY_KEY] = registry
    app[CONFIG_KEY] = config
    add_status_routes(app)
    if config.dashboard != "off":
        install_dashboard(app, app)
    return app


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def _listen(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=STOP_GRACE_SECONDS)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, int(runner.addresses[0][1])


@dataclass(eq=False)
class RunningEpp:
    """An EPP serving ext_proc on ``grpc_address`` (host:port), its admin routes on ``admin_url``."""

    grpc_address: str
    admin_url: str
    metrics_url: str | None
    state: RouterState
    registry: CollectorRegistry
    _server: Any = None
    _runners: list[web.AppRunner] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """Stop taking streams (those in flight get ``grace`` seconds), then the loops and listeners."""
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.state.gate is not None:
            await self.state.gate.stop()
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        if self.state.session is not None:
            await self.state.session.close()


async def start_epp(
    config: RouterConfig, *, admin_port: int, workers_start_healthy: bool = True
) -> RunningEpp:
    """Build and start the EPP described by ``config``: gRPC on ``config.host:config.port`` (0: any free
    port), admin on ``admin_port``, ``/metrics`` on ``config.prometheus_port`` (None: none)."""
    registry = CollectorRegistry()
    state = build_state(config, registry, workers_start_healthy=workers_start_healthy)
    state.session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
        timeout=aiohttp.ClientTimeout(total=config.request_timeout_secs),
    )
    running = RunningEpp("", "", None, state, registry)
    try:
        if config.program_scheduling is not None:
            state.gate = build_program_gate(config, state.session, registry, state.cache_index)
        state.refresh_candidates()
        if state.gate is not None:
            await state.gate.start()
        checker = attach_health_checker(state)
        running._tasks.append(asyncio.create_task(checker.run(), name="progrouter-epp-health"))
        if state.cache_index is not None:
            evict = evict_periodically(state.cache_index, config.eviction_interval_secs)
            running._tasks.append(asyncio.create_task(evict, name="progrouter-epp-eviction"))
        runner, port = await _listen(admin_app(state, registry), config.host, admin_port)
        running._runners.append(runner)
        running.admin_url = _url(config.host, port)
        if config.prometheus_port is not None:
            runner, port = await _listen(
                metrics_app(registry), config.prometheus_host, config.prometheus_port
            )
            running._runners.append(runner)
            running.metrics_url = _url(config.prometheus_host, port) + "/metrics"
        counters = None
        if config.epp_counter_usage and config.program_scheduling is not None:
            counters = CounterUsage()
            interval = config.program_scheduling.metrics_interval_seconds  # the backend observation's
            read = counters.run(state.session, lambda: state.targets, interval)
            running._tasks.append(asyncio.create_task(read, name="progrouter-epp-counters"))
        server = grpc.aio.server()
        processor = Processor(state, EppMetrics(registry), counters)
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(processor, server)
        server.add_generic_rpc_handlers((health_handler(state),))
        grpc_host = f"[{config.host}]" if ":" in config.host else config.host
        bound = server.add_insecure_port(f"{grpc_host}:{config.port}")
        await server.start()
        running._server = server
        running.grpc_address = f"{grpc_host}:{bound}"
    except BaseException:
        await running.stop()
        raise
    return running
