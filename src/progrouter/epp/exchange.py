"""One ext_proc stream: the life of one HTTP request that Envoy forwards.

Envoy sends the request headers, then the request body (BUFFERED: whole, in one message), then the response
headers and then either the response body chunk by chunk (STREAMED, ``epp_response_body: stream``) or
nothing more (``end``: only the worker's trailers, if it sends any); the EPP answers each message before
the next. The EPP answers the headers with CONTINUE, and the body with the chosen endpoint once the
decision is made: while the Program gate retains the request the EPP simply does not answer yet (Envoy
holds the request; its ``message_timeout`` must exceed the RequestPool's queue timeout). A refusal (429
queue timeout, 400 bad identity, 503) is an immediate response and ends the stream.

The response's completion reaches the scheduler exactly once. In ``stream`` the end of the body ends it,
with the usage read from the body (JSON at its end, SSE as it streams), and a stream that ends any other
way (the client reset, Envoy's timeout, the upstream failed before answering) completes the request as
failed. In ``end`` Envoy closes the stream when the HTTP stream ends, and that close is the end: a success
when the response headers said 2xx (a 2xx answer cut midway included: no body, no way to tell), a failure
when no response headers came. A request still retained is withdrawn from the RequestPool, because gRPC
cancels this coroutine the moment Envoy resets the stream.
"""

from __future__ import annotations

import logging
from typing import Any

from progrouter.epp.counter_usage import CounterUsage
from progrouter.epp.messages import header_map, proceed, refuse, route_to, status_and_type
from progrouter.epp.metrics import EppMetrics
from progrouter.epp.picker import Pick, Refusal, pick
from progrouter.server.state import RouterState

log = logging.getLogger("progrouter.epp")


class Exchange:
    """The request (headers, then buffered body) until it is routed; then its response, until it ends."""

    def __init__(self, state: RouterState, metrics: EppMetrics, counters: CounterUsage | None = None) -> None:
        self._state = state
        self._counters = counters  # ``epp_counter_usage``: the usage reported when no body is seen
        self._sent_bytes = 0
        self._metrics = metrics
        self._limit = state.config.max_payload_size
        self._route = "/"
        self._headers: Any = None
        self._body = bytearray()
        self._pick: Pick | None = None
        self._status = 0
        self._sse = False
        self._json: bytearray | None = bytearray()  # None once past the size limit: usage unknown
        # ``end``: no body comes, so the stream's close (with the HTTP stream) is the response's end.
        self._end_at_close = state.config.epp_response_body == "end"

    async def answer(self, message: Any) -> Any:
        """The answer to one of Envoy's messages. An ``immediate_response`` ends the stream."""
        phase = message.WhichOneof("request")
        self._metrics.received(phase)
        if phase == "request_headers":
            return await self._request_headers(message.request_headers)
        if phase == "request_body":
            return await self._request_body(message.request_body)
        if phase == "response_headers":
            return self._response_headers(message.response_headers)
        if phase == "response_body":
            return self._response_body(message.response_body)
        if phase == "response_trailers":  # the end, when the body is not sent (``end``)
            self._end()
        return proceed(phase)

    def close(self) -> None:
        """The stream is over (ended, reset or cancelled): a request not yet finished is finished now."""
        if self._pick is not None and self._status and self._end_at_close:
            # ``end``: Envoy closes (or resets) the stream when the HTTP stream ends; the status says how
            self._end()
        elif self._pick is not None:
            self._pick.finish(False)  # a no-op after a response that ended

    async def _request_headers(self, message: Any) -> Any:
        self._headers = header_map(message.headers)
        self._route = self._headers.get(":path", "/").split("?", 1)[0]
        if message.end_of_stream:  # no body: decide on the headers alone
            return await self._decide("request_headers")
        return proceed("request_headers")

    async def _request_body(self, message: Any) -> Any:
        if len(self._body) + len(message.body) > self._limit:
            self._metrics.decided("refused_413")
            return refuse(413, f"request body exceeds the {self._limit}-byte limit", "payload_too_large")
        self._body += message.body
        if not message.end_of_stream:
            return proceed("request_body")
        return await self._decide("request_body")

    async def _decide(self, phase: str) -> Any:
        try:
            self._pick = await pick(self._state, self._route, self._headers, bytes(self._body))
        except Refusal as refusal:
            self._metrics.decided(f"refused_{refusal.status}")
            return refuse(refusal.status, str(refusal), refusal.reason)
        self._sent_bytes = len(self._body)
        if self._counters is not None:
            self._counters.sent(self._pick.target, self._sent_bytes)
        self._body = bytearray()
        self._metrics.decided("native" if self._pick.ticket is None else "program")
        return route_to(phase, self._pick.endpoint, self._pick.target.dp_rank)

    def _response_headers(self, message: Any) -> Any:
        self._status, content_type = status_and_type(message.headers)
        self._sse = content_type.startswith("text/event-stream")
        if message.end_of_stream:
            self._end()
        return proceed("response_headers")

    def _response_body(self, message: Any) -> Any:
        ticket = self._pick.ticket if self._pick is not None else None
        if ticket is not None and message.body:
            if self._sse:
                ticket.observe_sse(message.body)
            elif self._json is not None and len(self._json) + len(message.body) <= self._limit:
                self._json += message.body
            else:
                self._json = None  # too large to read: the request completes without usage
        if message.end_of_stream:
            self._end()
        return proceed("response_body")

    def _end(self) -> None:
        """The response is complete: its usage in, then the request finished (2xx: success)."""
        if self._pick is None:
            return
        ticket = self._pick.ticket
        if ticket is not None and not self._sse and self._json:
            ticket.observe_json(bytes(self._json))
        if ticket is not None and self._counters is not None:
            usage = self._counters.usage(self._pick.target, self._sent_bytes)
            if usage is not None:
                ticket.observe_usage(usage)
        self._pick.finish(200 <= self._status < 300)
