"""`progrouter serve` from start to exit: listen, wait for a worker, serve until SIGTERM, drain, stop.

Startup follows upstream: the router listens at once (``/liveness`` 200, ``/readiness`` 503) and waits up
to ``worker_startup_timeout_secs``, probing every ``worker_startup_check_interval``, until at least one
configured worker answers its health endpoint; if none does, it exits 1. With no ``--worker-urls`` it serves
at once (workers come later through ``/add_worker``). Workers that did not answer stay unhealthy until the
health checks pass them (upstream counts them healthy until checks fail).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from progrouter.config import RouterConfig
from progrouter.server.edge.drain import drain
from progrouter.server.runner import RunningRouter, start_router

log = logging.getLogger("progrouter.router")


async def wait_for_workers(running: RunningRouter) -> bool:
    """The startup wait; True once a worker answered (and is healthy), False on timeout."""
    state = running.state
    config = state.config
    checker = state.checker
    assert checker is not None
    answered = await checker.wait_for_answer(
        state.worker_urls, config.worker_startup_timeout_secs, config.worker_startup_check_interval
    )
    state.workers_answered(answered)
    return bool(answered)


async def _until_stopped(stop: asyncio.Event, work: asyncio.Future[bool]) -> bool | None:
    """``work``'s result, or None when ``stop`` fired first (``work`` is then cancelled)."""
    stopping: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait([work, stopping], return_when=asyncio.FIRST_COMPLETED)
    if work in done:
        stopping.cancel()
        return work.result()
    work.cancel()
    return None


async def serve(config: RouterConfig) -> int:
    """Run until SIGINT/SIGTERM, then drain; the exit status (1 when no worker ever answered)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    running = await start_router(config, workers_start_healthy=not config.worker_urls)
    log.info(
        "progrouter listening on %s (policy %s, %d worker(s), metrics %s, Program scheduling %s)",
        running.url,
        config.policy.value,
        len(config.worker_urls),
        running.metrics_url or "off",
        "on" if config.program_scheduling is not None else "off",
    )
    try:
        if config.worker_urls:
            log.info(
                "waiting up to %gs for %d worker(s) to answer %s",
                config.worker_startup_timeout_secs,
                len(config.worker_urls),
                config.health_check_endpoint,
            )
            ready = await _until_stopped(stop, asyncio.ensure_future(wait_for_workers(running)))
            if ready is False:
                log.error(
                    "Timeout %gs waiting for workers %s to become healthy; "
                    "raise --worker-startup-timeout-secs",
                    config.worker_startup_timeout_secs,
                    config.worker_urls,
                )
                return 1
            if ready:
                log.info("ready: %d healthy target(s)", len(running.state.candidates))
        await stop.wait()
        await drain(running.state, config.drain_timeout_secs)
    finally:
        await running.stop()
    log.info("progrouter stopped")
    return 0
