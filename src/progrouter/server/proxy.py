"""The proxy: pick a target (Program gate or native policy), forward, relay JSON or SSE, retry before bytes.

Hot-path rules: the body is forwarded as the bytes received (never re-serialized) and parsed only when a
JSON route must be validated or a policy or the gate reads it; SSE is relayed chunk by chunk as it arrives;
a client disconnect cancels this handler (the server runs with ``handler_cancellation``), which closes the
upstream connection so the worker aborts the request too.

Only the inference routes of ``PROXIED_ROUTES`` are proxied (the app answers 404 to everything else), so
a worker's admin surface (``/sleep``, ``/collective_rpc``, the emulator's ``/admin/fault`` …) is never
reachable through the router.

Retries: one loop serves both paths. An attempt that got no usable answer (connection error, timeout before
the response started, or a status of ``retry.RETRYABLE_STATUSES``) is followed by another, after a backoff,
while ``retry_max_retries`` attempts in all allow it — never once a byte was relayed; the last attempt's
answer is relayed as it is. A native request goes back to its policy, which chooses among the available
targets (healthy, circuit breaker not open), preferring workers not yet tried. A Program request is never
moved by the proxy: its ticket is finished as failed (usage is charged only for the attempt whose answer
is relayed) and the gate is asked again, a fresh arrival that decides where it goes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

from progrouter.program import ScheduleError
from progrouter.routing.policies import RoutingRequest
from progrouter.routing.target import Target
from progrouter.server.edge.errors import json_error
from progrouter.server.edge.exchange import AiohttpExchange, Answer, Exchange, Stream
from progrouter.server.edge.headers import request_headers, response_headers
from progrouter.server.edge.limiter import InboundLimiter, Rejected
from progrouter.server.edge.request_id import HEADER as REQUEST_ID_HEADER
from progrouter.server.edge.request_id import REQUEST_ID
from progrouter.server.gate.contract import ProgramGate, ProgramTicket
from progrouter.server.hop.circuit_breaker import Breakers
from progrouter.server.hop.retry import RetryPolicy, is_retryable
from progrouter.server.hop.worker_client import WorkerClient, WorkerConnection, WorkerError
from progrouter.server.state import STATE_KEY, RouterState
from progrouter.server.telemetry import tracing
from progrouter.server.telemetry.event_feed import EventFeed
from progrouter.server.telemetry.metrics import NO_TARGET, RouterMetrics, status_class

if TYPE_CHECKING:
    from progrouter.server.dashboard.summary import Summary

log = logging.getLogger("progrouter.proxy")

# Typed routes: their body must be a JSON object (else 400), as upstream's typed handlers and vLLM enforce.
JSON_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/generate",
        "/inference/v1/generate",
    }
)
# Every POST route the router forwards: vLLM's inference surface, and nothing that changes a worker's state.
PROXIED_ROUTES = JSON_ROUTES | {
    "/v1/embeddings",
    "/v1/score",
    "/score",
    "/v1/rerank",
    "/rerank",
    "/v2/rerank",
    "/pooling",
    "/classify",
    "/tokenize",
    "/detokenize",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
}


@dataclass(eq=False)
class Proxy:
    """What the proxy keeps between requests: retry settings, circuit breakers, the inbound limiter and the
    connections to the workers."""

    retry: RetryPolicy
    breakers: Breakers
    limiter: InboundLimiter
    workers: WorkerClient
    rng: random.Random = field(default_factory=random.Random)

    def available(self, candidates: Sequence[Target], now: float) -> list[Target]:
        """The healthy targets whose circuit is not open: where native and Program requests may go."""
        return [t for t in candidates if self.breakers.allows(t.id, now)]


PROXY_KEY = web.AppKey("progrouter_proxy", Proxy)


class AvailableTargetsGate:
    """The Program gate, told of available targets only (healthy and circuit not open), as upstream's
    scheduler sees them; everything else passes through unchanged."""

    def __init__(self, gate: ProgramGate, proxy: Proxy) -> None:
        self._gate = gate
        self._proxy = proxy

    async def start(self) -> None:
        await self._gate.start()

    async def stop(self) -> None:
        await self._gate.stop()

    def set_healthy_targets(self, targets: Sequence[Target]) -> None:
        self._gate.set_healthy_targets(self._proxy.available(targets, time.monotonic()))

    def acquire(
        self, *, route: str, body: Mapping[str, Any] | None, raw_body: bytes, headers: Mapping[str, str]
    ) -> Coroutine[Any, Any, ProgramTicket | None]:
        return self._gate.acquire(route=route, body=body, raw_body=raw_body, headers=headers)

    def diagnostics(self, **page: int) -> dict[str, Any]:
        return self._gate.diagnostics(**page)

    def rejected(self, error: ScheduleError) -> None:
        self._gate.rejected(error)

    def shed_waiting(self) -> int:
        return self._gate.shed_waiting()

    def summary(self) -> Summary:
        return self._gate.summary()

    @property
    def feed(self) -> EventFeed:
        return self._gate.feed


class AttemptFailed(Exception):
    """An attempt that relayed nothing to the client, so another one may follow."""

    def __init__(self, status: int, cause: str, *, connection: bool) -> None:
        super().__init__(cause)
        self.status = status
        self.cause = cause
        self.connection = connection  # the worker itself is unreachable (so are its other Ranks)


class Refused(Exception):
    """No target for this attempt; ``retryable`` when a later attempt may find one."""

    def __init__(self, status: int, message: str, error_type: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.retryable = retryable


@dataclass(slots=True)
class _Call:
    """One client request being proxied."""

    request: Exchange
    state: RouterState
    proxy: Proxy
    route: str
    headers: CIMultiDict[str]
    started: float


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ is several times slower
class _Relayed:
    response: Answer
    success: bool  # a 2xx relayed in full
    worker_ok: bool  # what the circuit breaker hears: the worker answered, and not with a server error


def _is_stream(upstream: WorkerConnection) -> bool:
    content_type = upstream.headers.get("Content-Type", "")
    media = content_type.partition(";")[0].strip().lower()
    return media == "text/event-stream" or upstream.content_length is None


def _worker_ok(status: int) -> bool:
    return status < 500 and not is_retryable(status)


async def _forward(call: _Call, target: Target, ticket: ProgramTicket | None, *, may_retry: bool) -> _Relayed:
    """Send ``call`` to ``target`` and relay the answer.

    Raises AttemptFailed when nothing reached the client and the attempt is worth repeating.
    """
    headers = call.headers
    if target.dp_rank is not None:
        headers = headers.copy()
        headers["X-data-parallel-rank"] = str(target.dp_rank)
    metrics = call.state.metrics
    try:
        # A worker's redirect is relayed, never followed: the router contacts configured workers only.
        upstream = await call.proxy.workers.request(
            call.request.method, target.base_url, call.request.path_qs, headers, call.request.body
        )
    except TimeoutError as exc:
        metrics.upstream_errors.labels(target.id, "timeout").inc()
        raise AttemptFailed(504, f"worker {target.id} timed out", connection=False) from exc
    except WorkerError as exc:
        metrics.upstream_errors.labels(target.id, "connection").inc()
        raise AttemptFailed(502, f"worker {target.id} unreachable: {exc}", connection=True) from exc

    relayed: Answer | None = None
    complete = False
    status = upstream.status
    try:
        if may_retry and is_retryable(status):
            metrics.upstream_errors.labels(target.id, "status").inc()
            raise AttemptFailed(status, f"worker {target.id} answered {status}", connection=False)
        if _is_stream(upstream):
            stream: Stream | None = None
            try:
                stream = relayed = await call.request.stream(status, response_headers(upstream.headers))
                while chunk := await upstream.next_chunk():
                    if ticket is not None:
                        ticket.observe_sse(chunk)
                    await stream.write(chunk)
                    if ticket is not None and ticket.stream_done:
                        # [DONE] is out: a client that hangs up before the worker's stream ends (which
                        # cancels this handler while it waits for that end) got the whole answer.
                        ticket.finish(200 <= status < 300)
                if ticket is not None:
                    # The worker's part is done and its usage is in: a client that hangs up after [DONE]
                    # (which cancels this handler in write_eof) must not turn the request into a failure.
                    ticket.finish(200 <= status < 300)
                await stream.write_eof()
            except ConnectionResetError:  # the client went away mid-stream (not the worker's fault)
                log.debug("client left during the stream from %s", target.id)
                # Before the head went out, an unsent answer with the worker's status: nobody reads it.
                return _Relayed(stream or web.StreamResponse(status=status), False, True)
        else:
            data = await upstream.read()
            if ticket is not None:
                ticket.observe_json(data)
            relayed = web.Response(status=status, body=data, headers=response_headers(upstream.headers))
        complete = True
        return _Relayed(relayed, 200 <= status < 300, _worker_ok(status))
    except (WorkerError, TimeoutError) as exc:
        kind = "timeout" if isinstance(exc, TimeoutError) else "connection"
        metrics.upstream_errors.labels(target.id, kind).inc()
        if relayed is None or not relayed.prepared:
            status, cause = (504, "timed out") if kind == "timeout" else (502, f"failed: {exc}")
            raise AttemptFailed(status, f"worker {target.id} {cause}", connection=False) from exc
        # Headers and part of the stream are out: the only honest signal left is a broken connection.
        log.warning("stream from %s broke off after the response started: %r", target.id, exc)
        call.request.abort()
        return _Relayed(relayed, False, False)
    finally:
        if complete:
            upstream.release()
        else:
            upstream.close()  # abandon the worker's connection: it sees the disconnect and aborts


# ------------------------------------------------------------------------------------------ accounting
def _record(call: _Call, target_id: str, status: int | None, error_type: str | None = None) -> None:
    """One answer to the client (status None: the client left first), in every metric family that counts it.

    ``error_type`` names a failure the router made itself; a worker's status is classed as upstream does.
    """
    seconds = time.perf_counter() - call.started
    metrics = call.state.metrics
    # a success also counts in requests_total and generate_duration (RouterMetrics.observe)
    metrics.observe(target_id, call.route, "error" if status is None else status_class(status), seconds)
    if status is not None and not 200 <= status < 300:
        if error_type is not None:
            metrics.child(metrics.request_errors, call.route, error_type).inc()
        elif is_retryable(status):
            metrics.child(metrics.retries_exhausted, call.route).inc()
        else:
            metrics.child(metrics.request_errors, call.route, "non_retryable_error").inc()
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "%s %s -> %s %s %.1f ms", call.request.method, call.request.path, target_id, status, seconds * 1e3
        )


def _fail(call: _Call, status: int, message: str, error_type: str) -> web.Response:
    """The router's own error answer; a 429 (a full pool or queue, a queue timeout) says when to retry."""
    _record(call, NO_TARGET, status, error_type)
    response = json_error(status, message)
    if status == 429:
        response.headers["Retry-After"] = "1"
    return response


# --------------------------------------------------------------------------------- choosing a target
class _Native:
    """Targets from the native policy, over the available targets, preferring workers not yet tried."""

    def __init__(self, call: _Call, body: Mapping[str, Any] | None) -> None:
        self.call = call
        self.routing = RoutingRequest(call.request.headers, body, call.request.body)
        self.failed: set[str] = set()  # target ids
        self.dead_workers: set[str] = set()

    async def pick(self) -> tuple[Target, None]:
        state, proxy = self.call.state, self.call.proxy
        available = proxy.available(state.candidates, time.monotonic())
        if not available:
            message = "no healthy workers are available (all are unhealthy or their circuit is open)"
            raise Refused(503, message, "no_available_workers", retryable=True)
        fresh = [t for t in available if t.id not in self.failed and t.base_url not in self.dead_workers]
        policy = state.policy
        if policy.prepares:
            await policy.prepare(self.routing)
        target = policy.select(fresh or available, self.routing)
        _record_decision(state.metrics, policy.name, policy.last_decision, target)
        if policy.name == "cache_aware":
            _record_cache_aware(state, available)
        return target, None

    def attempt_failed(self, target: Target, failure: AttemptFailed) -> None:
        self.failed.add(target.id)
        if failure.connection:
            self.dead_workers.add(target.base_url)


class _Program:
    """Targets from the Program gate: every attempt is a fresh arrival; the gate decides where it goes."""

    def __init__(self, call: _Call, body: Mapping[str, Any] | None, first: ProgramTicket) -> None:
        self.call = call
        self.body = body
        self.first: ProgramTicket | None = first

    async def pick(self) -> tuple[Target, ProgramTicket]:
        ticket, self.first = self.first, None
        if ticket is None:
            ticket = await _acquire(self.call, self.body)
            if ticket is None:
                message = "Program scheduling dropped the request"
                raise Refused(503, message, "program_dropped", retryable=False)
        return ticket.target, ticket

    def attempt_failed(self, target: Target, failure: AttemptFailed) -> None:
        """Nothing to remember: the scheduler hears the failure through the ticket."""


async def _acquire(call: _Call, body: Mapping[str, Any] | None) -> ProgramTicket | None:
    gate = call.state.gate
    assert gate is not None
    try:
        headers = call.request.headers
        return await gate.acquire(route=call.route, body=body, raw_body=call.request.body, headers=headers)
    except ScheduleError as exc:
        gate.rejected(exc)
        raise Refused(exc.status, str(exc), "program_scheduling", retryable=False) from exc


def _record_decision(metrics: RouterMetrics, policy: str, decision: str, target: Target) -> None:
    metrics.child(metrics.policy_decisions, policy, target.id).inc()
    if decision == "cache_affinity":
        metrics.cache_hits.inc()
    elif decision:
        metrics.cache_misses.inc()
    if decision == "load_balance":
        metrics.load_balancing_events.inc()


def _record_cache_aware(state: RouterState, available: list[Target]) -> None:
    metrics = state.metrics
    loads = [state.policy.in_flight.get(t.id, 0) for t in available]
    metrics.max_load.set(max(loads))
    metrics.min_load.set(min(loads))
    if state.cache_index is not None:
        for t in available:
            metrics.child(metrics.tree_size, t.id).set(state.cache_index.size(t.id))


# ------------------------------------------------------------------------------------ the retry loop
async def _relay(call: _Call, chooser: _Native | _Program) -> Answer:
    state, proxy = call.state, call.proxy
    metrics = state.metrics
    attempts = proxy.retry.attempts
    last: AttemptFailed | Refused | None = None
    for attempt in range(1, attempts + 1):
        final = attempt == attempts
        if attempt > 1:
            delay = proxy.retry.backoff_seconds(attempt - 1, proxy.rng)
            metrics.child(metrics.retries, call.route).inc()
            metrics.child(metrics.retry_backoff, str(attempt - 1)).observe(delay)
            await asyncio.sleep(delay)
        try:
            target, ticket = await chooser.pick()
            tracing.annotate(rank=target.id, attempt=attempt)
        except Refused as refused:
            if not refused.retryable or final:
                return _fail(call, refused.status, str(refused), refused.error_type)
            last = refused
            continue
        relayed: _Relayed | None = None
        worker_ok: bool | None = None
        series = metrics.target(target.id)
        series.started()
        state.policy.on_start(target)
        try:
            relayed = await _forward(call, target, ticket, may_retry=not final)
            worker_ok = relayed.worker_ok
            _record(call, target.id, relayed.response.status)
            return relayed.response
        except asyncio.CancelledError:  # the client left: counted, with no status
            _record(call, target.id, None)
            raise
        except AttemptFailed as failed:
            worker_ok = False
            last = failed
            chooser.attempt_failed(target, failed)
            log.info("attempt %d of %d on %s failed: %s", attempt, attempts, target.id, failed.cause)
        finally:
            if ticket is not None:
                ticket.finish(relayed is not None and relayed.success)
            series.finished(worker_ok)
            state.policy.on_finish(target)
            if worker_ok is not None:
                proxy.breakers.record(target.id, worker_ok, time.monotonic())
    assert last is not None
    if isinstance(last, Refused):
        return _fail(call, last.status, str(last), last.error_type)
    _record(call, NO_TARGET, last.status)
    return json_error(last.status, last.cause)


_INVALID = object()


async def handle_post(request: web.Request) -> web.StreamResponse:
    """The aiohttp route handler of every proxied route."""
    answer = await proxy_request(
        AiohttpExchange(request, await request.read()),  # read whole by the edge (``connection.body_reader``)
        request.app[STATE_KEY],
        request.app[PROXY_KEY],
    )
    assert isinstance(answer, web.StreamResponse)  # AiohttpExchange streams are aiohttp's own
    return answer


async def proxy_request(request: Exchange, state: RouterState, proxy: Proxy) -> Answer:
    """Proxy one request that passed the edge, whichever server carries it (aiohttp's or the front door)."""
    call = _Call(request, state, proxy, request.path, CIMultiDict(), time.perf_counter())
    try:
        if not proxy.limiter.try_take():
            await proxy.limiter.acquire()
    except Rejected as rejected:
        state.metrics.inbound_rejections.labels(rejected.reason).inc()
        response = _fail(call, rejected.status, str(rejected), rejected.reason)
        if rejected.status == 429:
            response.headers["Retry-After"] = "1"
        return response
    try:
        with tracing.request_span(call.route, REQUEST_ID.get(), request.headers):
            answer = await _proxy(call)
            tracing.annotate(status=answer.status)
            return answer
    finally:
        proxy.limiter.release()


async def _proxy(call: _Call) -> Answer:
    request, state = call.request, call.state

    body: Mapping[str, Any] | None = None
    json_route = call.route in JSON_ROUTES
    if json_route or state.policy.needs_body or state.gate is not None:
        try:
            parsed: Any = orjson.loads(request.body)
        except orjson.JSONDecodeError as exc:
            if json_route:
                return _fail(call, 400, f"malformed JSON body: {exc}", "bad_request")
            parsed = _INVALID
        if isinstance(parsed, dict):
            body = parsed
        elif json_route:
            return _fail(call, 400, "request body must be a JSON object", "bad_request")
    call.headers = request_headers(request.headers, "application/json" if json_route else None)
    request_id = REQUEST_ID.get()
    if request_id is not None:
        call.headers[REQUEST_ID_HEADER] = request_id
    tracing.inject(call.headers)

    try:
        first: ProgramTicket | None = None
        if state.gate is not None:
            asked = time.perf_counter()
            try:
                first = await _acquire(call, body)
            except Refused as refused:
                return _fail(call, refused.status, str(refused), refused.error_type)
            finally:
                tracing.annotate(pooled_seconds=time.perf_counter() - asked)
        # A Program request is never routed natively: no policy input is built for it.
        chooser = _Native(call, body) if first is None else _Program(call, body, first)
        tracing.annotate(scheduling="program" if isinstance(chooser, _Program) else "native")
        return await _relay(call, chooser)
    except asyncio.CancelledError:
        raise
    except Exception:  # nothing a request does may take the server down
        log.exception("unexpected error while proxying %s", request.path)
        return _fail(call, 500, "internal router error", "internal_error")
