"""The contract between the proxy and Program scheduling (implemented in ``program_gate.py``).

The proxy asks the gate for a ticket per request; no ticket means "no Program identity, route natively".
A ticket names the Rank to use, hears the response (for usage accounting) and is finished exactly once.
Typed as protocols so the proxy depends on the contract, not on the scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
from prometheus_client import CollectorRegistry

from progrouter.config import RouterConfig
from progrouter.routing.prefix_tree import CacheAwareIndex
from progrouter.routing.target import Target
from progrouter.server.telemetry.event_feed import EventFeed

if TYPE_CHECKING:
    from progrouter.program import ScheduleError, UsageObservation
    from progrouter.routing.kv_aware import KvAwarePolicy
    from progrouter.server.dashboard.summary import Summary


class ProgramTicket(Protocol):
    @property
    def target(self) -> Target: ...
    def observe_json(self, body: bytes) -> None: ...
    def observe_sse(self, chunk: bytes) -> None: ...
    def observe_usage(self, usage: UsageObservation) -> None: ...
    @property
    def stream_done(self) -> bool: ...
    def finish(self, success: bool) -> None: ...


class ProgramGate(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def set_healthy_targets(self, targets: Sequence[Target]) -> None: ...
    async def acquire(
        self, *, route: str, body: Mapping[str, Any] | None, raw_body: bytes, headers: Mapping[str, str]
    ) -> ProgramTicket | None: ...
    def diagnostics(self, *, offset: int = 0, limit: int = ...) -> dict[str, Any]: ...
    def rejected(self, error: ScheduleError) -> None: ...
    def shed_waiting(self) -> int: ...
    def summary(self) -> Summary: ...
    @property
    def feed(self) -> EventFeed: ...


def build_program_gate(
    config: RouterConfig,
    session: aiohttp.ClientSession,
    registry: CollectorRegistry,
    cache_index: CacheAwareIndex | None,
    kv_aware: KvAwarePolicy | None = None,
) -> ProgramGate:
    """Import the scheduler shell only when Program scheduling is on (it pulls in the whole core)."""
    from progrouter.server.gate.program_gate import ProgramGate as SchedulingGate

    return SchedulingGate(config, session, registry, cache_index, kv_aware)
