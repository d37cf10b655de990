"""What the ``make_engine`` and ``make_router`` fixtures (root ``tests/conftest.py``) hand to a test."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from progrouter.config import ProgramSchedulingConfig, RouterConfig
from progrouter.engine.server import RunningEngine
from progrouter.server.runner import RunningRouter

EngineFactory = Callable[..., Awaitable[RunningEngine]]
RouterFactory = Callable[..., Awaitable[RunningRouter]]


def router_config(
    worker_urls: list[str], program: dict[str, Any] | None = None, **overrides: Any
) -> RouterConfig:
    """A test router: any free port, no Prometheus listener, round robin, health checks out of the way."""
    fields: dict[str, Any] = {
        "worker_urls": worker_urls,
        "port": 0,
        "prometheus_port": None,
        "policy": "round_robin",
        "health_check_interval_secs": 3600.0,
        "program_scheduling": None if program is None else ProgramSchedulingConfig(**program),
    }
    fields.update(overrides)
    return RouterConfig(**fields)
