"""The EPP's decision: which endpoint (and DP Rank) one request goes to, and its single completion.

The same decision as `serve`'s: a request with Program identity goes through the Program gate (which may
hold it in the RequestPool, or refuse it: 400 bad identity, 429 queue timeout, 503 no Rank); one without
goes to the native policy over the healthy targets. The gate and the policy are the ones `serve` uses;
this module only adapts them to a request that Envoy forwards (the EPP never sees the worker itself).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping
from typing import Any

import orjson
from yarl import URL

from progrouter.program import ScheduleError
from progrouter.routing.policies import RoutingRequest
from progrouter.routing.target import Target
from progrouter.server.gate.contract import ProgramTicket
from progrouter.server.state import RouterState

log = logging.getLogger("progrouter.epp")


class Refusal(Exception):
    """The EPP answers the client itself (no endpoint): ``status`` and an error message."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason  # bounded: a metric label and Envoy's ``details``


def endpoint_of(target: Target) -> str:
    """``host:port`` of a target, as an ORIGINAL_DST cluster connects to it."""
    return _endpoint(target.base_url)


@functools.lru_cache(maxsize=1024)  # one entry per worker URL: parsed once, not per request
def _endpoint(base_url: str) -> str:
    url = URL(base_url)
    host = f"[{url.host}]" if url.host and ":" in url.host else url.host
    return f"{host}:{url.port}"


class Pick:
    """One routed request: its target, its Program ticket (None: native), and its single finish."""

    __slots__ = ("_finished", "_state", "target", "ticket")

    def __init__(self, state: RouterState, target: Target, ticket: ProgramTicket | None) -> None:
        self._state = state
        self.target = target
        self.ticket = ticket
        self._finished = False
        if ticket is None:
            state.policy.on_start(target)

    @property
    def endpoint(self) -> str:
        return endpoint_of(self.target)

    def finish(self, success: bool) -> None:
        """The response ended (``success``: a 2xx relayed whole) or never will; only the first call counts."""
        if self._finished:
            return
        self._finished = True
        if self.ticket is not None:
            self.ticket.finish(success)
        else:
            self._state.policy.on_finish(self.target)


def _snake(name: str) -> str:
    """``QueueTimeout`` → ``queue_timeout``: a refusal's bounded reason."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def parse_body(raw: bytes) -> Mapping[str, Any] | None:
    """The JSON object of a request body, or None (not JSON, or not an object): the worker judges it."""
    if not raw:
        return None
    try:
        parsed: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


async def pick(state: RouterState, route: str, headers: Mapping[str, str], raw: bytes) -> Pick:
    """Where this request goes; waits while the Program gate retains it. Raises ``Refusal``."""
    body = parse_body(raw)
    gate = state.gate
    if gate is not None:
        try:
            ticket = await gate.acquire(route=route, body=body, raw_body=raw, headers=headers)
        except ScheduleError as exc:
            gate.rejected(exc)
            raise Refusal(exc.status, str(exc), _snake(type(exc).__name__)) from exc
        if ticket is not None:
            return Pick(state, ticket.target, ticket)
    if not state.candidates:
        raise Refusal(503, "no healthy workers are available", "no_available_workers")
    target = state.policy.select(state.candidates, RoutingRequest(headers, body, raw))
    return Pick(state, target, None)
