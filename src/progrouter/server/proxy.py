"""The POST proxy: pick a target (Program gate or native policy), forward, relay JSON or SSE.

Hot-path rules: the body is forwarded as the bytes received (never re-serialized) and parsed only when a
JSON route must be validated or a policy or the gate reads it; SSE is relayed chunk by chunk as it arrives;
a client disconnect cancels this handler (the server runs with ``handler_cancellation``), which closes the
upstream connection so the worker aborts the request too.

Retries: an attempt that got no usable answer (connection error, timeout before the response started, or a
502/503/504 status) is retried on another target while ``retry_max_retries`` allows — never once a byte was
relayed. A Program request is never moved by the proxy: its ticket is finished as failed and the gate is
asked again (a fresh arrival), which decides where it goes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from progrouter.program.types import ScheduleError
from progrouter.routing.policies import RoutingRequest
from progrouter.routing.target import Target
from progrouter.server.errors import json_error
from progrouter.server.gate import ProgramTicket
from progrouter.server.headers import request_headers, response_headers
from progrouter.server.metrics import NO_TARGET, status_class
from progrouter.server.state import STATE_KEY, RouterState

log = logging.getLogger("progrouter.proxy")

# Typed generation routes: their body must be a JSON object (else 400), as upstream's typed handlers enforce.
JSON_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/generate",
        "/inference/v1/generate",
    }
)
KNOWN_ROUTES = JSON_ROUTES | {"/v1/embeddings", "/v1/score", "/v1/rerank", "/tokenize", "/detokenize"}
RETRYABLE_STATUSES = frozenset({502, 503, 504})


def route_label(path: str) -> str:
    """A bounded metrics label: the route itself if known, else ``other``."""
    return path if path in KNOWN_ROUTES else "other"


class AttemptFailed(Exception):
    """An attempt that relayed nothing to the client, so another one may follow."""

    def __init__(self, status: int, cause: str, *, connection: bool) -> None:
        super().__init__(cause)
        self.status = status
        self.cause = cause
        self.connection = connection  # the worker itself is unreachable (so are its other Ranks)


@dataclass(slots=True)
class _Call:
    """One client request being proxied."""

    request: web.Request
    state: RouterState
    route: str
    raw: bytes
    headers: CIMultiDict[str]
    started: float


def _is_stream(upstream: aiohttp.ClientResponse) -> bool:
    return upstream.content_type == "text/event-stream" or upstream.content_length is None


async def _forward(
    call: _Call, target: Target, ticket: ProgramTicket | None, *, may_retry: bool
) -> tuple[web.StreamResponse, bool]:
    """Send ``call`` to ``target`` and relay the answer; (response, completed successfully).

    Raises AttemptFailed when nothing reached the client and the attempt is worth repeating elsewhere.
    """
    state = call.state
    session = state.session
    assert session is not None
    headers = call.headers
    if target.dp_rank is not None:
        headers = headers.copy()
        headers["X-data-parallel-rank"] = str(target.dp_rank)
    url = target.base_url + call.request.path_qs
    metrics = state.metrics
    try:
        # A worker's redirect is relayed, never followed: the router contacts configured workers only.
        upstream = await session.request(
            call.request.method, url, data=call.raw, headers=headers, allow_redirects=False
        )
    except TimeoutError as exc:
        metrics.upstream_errors.labels(target.id, "timeout").inc()
        raise AttemptFailed(504, f"worker {target.id} timed out", connection=False) from exc
    except aiohttp.ClientError as exc:
        metrics.upstream_errors.labels(target.id, "connection").inc()
        raise AttemptFailed(502, f"worker {target.id} unreachable: {exc!r}", connection=True) from exc

    relayed: web.StreamResponse | None = None
    complete = False
    try:
        if may_retry and upstream.status in RETRYABLE_STATUSES:
            metrics.upstream_errors.labels(target.id, "status").inc()
            raise AttemptFailed(
                upstream.status, f"worker {target.id} answered {upstream.status}", connection=False
            )
        if _is_stream(upstream):
            relayed = web.StreamResponse(status=upstream.status, headers=response_headers(upstream.headers))
            try:
                await relayed.prepare(call.request)
                async for chunk in upstream.content.iter_any():
                    if ticket is not None:
                        ticket.observe_sse(chunk)
                    await relayed.write(chunk)
                if ticket is not None:
                    # The worker's part is done and its usage is in: a client that hangs up after [DONE]
                    # (which cancels this handler in write_eof) must not turn the request into a failure.
                    ticket.finish(200 <= upstream.status < 300)
                await relayed.write_eof()
            except ConnectionResetError:  # the client went away mid-stream (not the worker's fault)
                log.debug("client left during the stream from %s", target.id)
                return relayed, False
        else:
            data = await upstream.read()
            if ticket is not None:
                ticket.observe_json(data)
            relayed = web.Response(
                status=upstream.status, body=data, headers=response_headers(upstream.headers)
            )
        complete = True
        return relayed, 200 <= upstream.status < 300
    except (aiohttp.ClientError, TimeoutError) as exc:
        kind = "timeout" if isinstance(exc, TimeoutError) else "connection"
        metrics.upstream_errors.labels(target.id, kind).inc()
        if relayed is None or not relayed.prepared:
            status, cause = (504, "timed out") if kind == "timeout" else (502, f"failed: {exc!r}")
            raise AttemptFailed(status, f"worker {target.id} {cause}", connection=False) from exc
        # Headers and part of the stream are out: the only honest signal left is a broken connection.
        log.warning("stream from %s broke off after the response started: %r", target.id, exc)
        if call.request.transport is not None:
            call.request.transport.close()
        return relayed, False
    finally:
        if complete:
            upstream.release()
        else:
            upstream.close()  # abandon the worker's connection: it sees the disconnect and aborts


def _record(call: _Call, target_id: str, status: int | None) -> None:
    seconds = time.perf_counter() - call.started
    call.state.metrics.observe(
        target_id, call.route, "error" if status is None else status_class(status), seconds
    )
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "%s %s -> %s %s %.1f ms",
            call.request.method,
            call.request.path,
            target_id,
            status,
            seconds * 1e3,
        )


def _fail(call: _Call, status: int, message: str) -> web.Response:
    _record(call, NO_TARGET, status)
    return json_error(status, message)


async def _native(call: _Call, body: Mapping[str, Any] | None) -> web.StreamResponse:
    state = call.state
    retries = state.config.retry_max_retries
    tried: set[str] = set()
    dead_workers: set[str] = set()
    routing = RoutingRequest(call.request.headers, body, call.raw)
    last: AttemptFailed | None = None
    for attempt in range(retries + 1):
        candidates = state.candidates
        if not candidates:
            return _fail(call, 503, "no healthy workers are available")
        pool = [t for t in candidates if t.id not in tried and t.base_url not in dead_workers] or [
            t for t in candidates if t.id not in tried
        ]
        if not pool:
            break
        if attempt:
            state.metrics.retries.inc()
        target = state.policy.select(pool, routing)
        tried.add(target.id)
        in_flight = state.metrics.in_flight.labels(target.id)
        state.policy.on_start(target)
        in_flight.inc()
        try:
            response, _ok = await _forward(call, target, None, may_retry=attempt < retries)
            _record(call, target.id, response.status)
            return response
        except asyncio.CancelledError:  # the client left: counted, with no status
            _record(call, target.id, None)
            raise
        except AttemptFailed as failed:
            last = failed
            if failed.connection:
                dead_workers.add(target.base_url)
            log.info("attempt %d on %s failed: %s", attempt + 1, target.id, failed.cause)
        finally:
            in_flight.dec()
            state.policy.on_finish(target)
    assert last is not None
    _record(call, NO_TARGET, last.status)
    return json_error(last.status, last.cause)


async def _program(call: _Call, body: Mapping[str, Any] | None) -> web.StreamResponse | None:
    """The Program path; None when the request has no Program identity (route it natively)."""
    state = call.state
    gate = state.gate
    assert gate is not None
    retries = state.config.retry_max_retries
    last: AttemptFailed | None = None
    for attempt in range(retries + 1):
        try:
            ticket = await gate.acquire(
                route=call.route, body=body, raw_body=call.raw, headers=call.request.headers
            )
        except ScheduleError as exc:
            return _fail(call, exc.status, str(exc))
        if ticket is None:
            return None if attempt == 0 else _fail(call, 503, "Program scheduling dropped the request")
        if attempt:
            state.metrics.retries.inc()
        target = ticket.target
        success = False
        in_flight = state.metrics.in_flight.labels(target.id)
        state.policy.on_start(target)
        in_flight.inc()
        try:
            response, success = await _forward(call, target, ticket, may_retry=attempt < retries)
            _record(call, target.id, response.status)
            return response
        except asyncio.CancelledError:
            _record(call, target.id, None)
            raise
        except AttemptFailed as failed:
            last = failed
            log.info("Program attempt %d on %s failed: %s", attempt + 1, target.id, failed.cause)
        finally:
            ticket.finish(success)
            in_flight.dec()
            state.policy.on_finish(target)
    assert last is not None
    _record(call, NO_TARGET, last.status)
    return json_error(last.status, last.cause)


_INVALID = object()


async def handle_post(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    route = route_label(request.path)
    call = _Call(request, state, route, b"", CIMultiDict(), time.perf_counter())
    limit = state.config.max_payload_size
    if request.content_length is not None and request.content_length > limit:
        return _fail(call, 413, f"request body exceeds the {limit}-byte limit")
    try:
        call.raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return _fail(call, 413, f"request body exceeds the {limit}-byte limit")

    body: Mapping[str, Any] | None = None
    json_route = route in JSON_ROUTES
    if json_route or state.policy.needs_body or state.gate is not None:
        try:
            parsed: Any = orjson.loads(call.raw)
        except orjson.JSONDecodeError as exc:
            if json_route:
                return _fail(call, 400, f"malformed JSON body: {exc}")
            parsed = _INVALID
        if isinstance(parsed, dict):
            body = parsed
        elif json_route:
            return _fail(call, 400, "request body must be a JSON object")
    call.headers = request_headers(request.headers, "application/json" if json_route else None)

    try:
        if state.gate is not None:
            response = await _program(call, body)
            if response is not None:
                return response
        return await _native(call, body)
    except asyncio.CancelledError:
        raise
    except Exception:  # nothing a request does may take the server down
        log.exception("unexpected error while proxying %s", request.path)
        return _fail(call, 500, "internal router error")
