"""The emulator's HTTP shell: vLLM's OpenAI-compatible API around one EngineCore per data-parallel Rank.

Each Rank has a driver task that advances its core in modelled time: a step that models ``d`` seconds ends
``d / time_scale`` wall seconds after it starts (deadline-based, so slow Python shows up as lag, not as
drift), and its tokens are delivered to the waiting handlers at that moment. Modelled time is
``(loop.time() - start) * time_scale``; every duration the server reports (histograms, nothing else) is in
modelled seconds. Handlers never touch blocks: they submit, await outputs, and abort on disconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from progrouter.engine import anthropic, responses
from progrouter.engine.chat_template import ChatTemplateError, render_chat
from progrouter.engine.config import EngineConfig
from progrouter.engine.core import EngineCore, RequestOutput, RequestRejected
from progrouter.engine.kv_events import KVEventRecorder
from progrouter.engine.kv_events_publisher import RankEventPublisher
from progrouter.engine.metrics import CONTENT_TYPE, render_metrics
from progrouter.engine.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    describe,
    error_body,
)
from progrouter.engine.request import SamplingParams
from progrouter.engine.tokenizer import Tokenizer
from progrouter.engine.usage import TokenUsage

_Req = TypeVar("_Req", bound=BaseModel)
log = logging.getLogger(__name__)

DP_RANK_HEADER = "X-data-parallel-rank"


class FaultMode(StrEnum):
    NONE = "none"
    REFUSE = "refuse"  # new requests to the Rank get 503
    STALL = "stall"  # the Rank stops stepping; its requests hang until the mode changes
    CUT_STREAMS = "cut_streams"  # every response of the Rank is cut off after its next token


class HTTPError(Exception):
    """An error answer in vLLM's ErrorResponse shape; ``validation``: the body itself is malformed (vLLM
    answers those before any API's handler runs, so in the OpenAI shape whatever the route)."""

    def __init__(
        self,
        status: int,
        message: str,
        err_type: str = "BadRequestError",
        *,
        param: str | None = None,
        validation: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.param = param
        self.validation = validation

    def response(self) -> web.Response:
        body = error_body(str(self), status=self.status, err_type=self.err_type, param=self.param)
        return _json(body, status=self.status)

    def dialect_response(self, *, anthropic_shaped: bool) -> web.Response:
        """The answer of the Messages and Responses routes: a malformed body as vLLM's request validation
        answers it (type ``Bad Request``); any later error Anthropic-shaped on the Messages routes."""
        if self.validation:
            body = error_body(str(self), status=400, err_type="Bad Request", param=self.param)
            return _json(body, status=400)
        if anthropic_shaped:
            return _json(anthropic.error_body(self.err_type, str(self)), status=self.status)
        return self.response()


class _EventStream(Protocol):
    """One streamed answer of the Messages or Responses API, as (event name, data) pairs."""

    def head(self) -> list[tuple[str, dict[str, Any]]]: ...
    def tokens(self, text: str) -> list[tuple[str, dict[str, Any]]]: ...
    def finish(self, finish_reason: str, usage: TokenUsage) -> list[tuple[str, dict[str, Any]]]: ...


@web.middleware
async def _error_responses(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every handler reports a bad request by raising ``HTTPError``; this turns it into vLLM's answer."""
    try:
        return await handler(request)
    except HTTPError as exc:
        return exc.response()


def _cut(request: web.Request, resp: web.StreamResponse) -> web.StreamResponse:
    """Fault ``cut_streams``: drop the connection mid-response, as a crashing server would."""
    if request.transport is not None:
        request.transport.abort()
    resp.force_close()
    return resp


def _sse_event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


class ModelClock:
    """Modelled seconds since the server started, running ``time_scale`` times faster than the wall."""

    def __init__(self, loop: asyncio.AbstractEventLoop, time_scale: float) -> None:
        self._loop = loop
        self._wall0 = loop.time()
        self.time_scale = time_scale

    def now(self) -> float:
        return (self._loop.time() - self._wall0) * self.time_scale

    def wall_delay(self, model_time: float) -> float:
        return (model_time - self.now()) / self.time_scale


class RequestStream:
    """Outputs of one request, in order, from the driver to its handler."""

    __slots__ = ("finished", "queue", "request_id")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.finished = False


class RankDriver:
    """Steps one EngineCore in modelled time and hands each step's outputs to the requests' streams."""

    def __init__(self, core: EngineCore, clock: ModelClock, events: RankEventPublisher | None = None) -> None:
        self.core = core
        self.clock = clock
        self.events = events
        self.mode = FaultMode.NONE
        self.streams: dict[str, RequestStream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"engine-rank-{self.core.rank}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.events is not None:
            await self.events.stop()

    def reset_prefix_cache(self) -> None:
        self.core.reset_prefix_cache()
        if self.events is not None:
            self.events.flush()  # the AllBlocksCleared goes out now, not with the next step

    def submit(
        self, request_id: str, prompt: list[int], params: SamplingParams, cache_salt: str | None
    ) -> RequestStream:
        self.core.add_request(request_id, prompt, params, self.clock.now(), cache_salt=cache_salt)
        stream = self.streams[request_id] = RequestStream(request_id)
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        self.streams.pop(request_id, None)
        if self.core.abort(request_id):
            self._wake.set()

    def set_mode(self, mode: FaultMode) -> None:
        if self.mode is FaultMode.STALL and mode is not FaultMode.STALL:
            self.core.hold_until(self.clock.now())  # resume in the present; the stall cost real time
        self.mode = mode
        self._wake.set()

    async def _idle(self, timeout: float | None = None) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def _run(self) -> None:
        core, clock = self.core, self.clock
        while True:
            if self.mode is FaultMode.STALL:
                await self._idle()
                continue
            t = core.next_event_time()
            if t is None:
                await self._idle()
                continue
            result = core.step(t)
            if self.events is not None:
                self.events.flush()
            if result.num_scheduled_tokens == 0:
                await self._idle(max(clock.wall_delay(core.next_event_time() or t), 0.001))
                continue
            delay = clock.wall_delay(result.end)
            await asyncio.sleep(delay if delay > 0 else 0)
            streams = self.streams
            for out in result.outputs:
                stream = streams.get(out.request_id)
                if stream is None:
                    continue
                if out.finished:
                    stream.finished = True
                    del streams[out.request_id]
                stream.queue.put_nowait(out)


@dataclass
class _Prepared:
    """A validated generation request, ready for a Rank."""

    kind: str  # "completion" | "chat" | "messages" | "responses"
    prompt: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    continuous_usage: bool
    cache_salt: str | None
    responses_request: responses.ResponsesRequest | None = None


@dataclass
class _Generated:
    token_ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    num_cached_tokens: int = 0


class EngineServer:
    """The aiohttp application and its Rank drivers; build with ``EngineServer(config).app()``."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        events = config.kv_events_config
        self.recorders = (
            [KVEventRecorder(config.block_size) for _ in range(config.data_parallel_size)]
            if events is not None and events.publishes
            else []
        )
        self.cores = [
            EngineCore(config, rank=r, events=self.recorders[r] if self.recorders else None)
            for r in range(config.data_parallel_size)
        ]
        self.tokenizer = Tokenizer(config.vocab_size)
        self.fail_rate = config.fail_rate
        self.drivers: list[RankDriver] = []
        self._clock: ModelClock | None = None
        self._fail_rng = random.Random(config.seed)
        self._ids = itertools.count()

    # ---- lifecycle ------------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30, middlewares=[_error_responses])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/messages", self.create_messages)
        app.router.add_post("/v1/messages/count_tokens", self.count_message_tokens)
        app.router.add_post("/v1/responses", self.create_response)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/server_info", self.server_info)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_post("/admin/fault", self.admin_fault)
        app.router.add_get("/admin/fault", self.admin_fault_status)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        self._clock = ModelClock(asyncio.get_running_loop(), self.config.time_scale)
        publishers = self._start_publishers()
        self.drivers = [
            RankDriver(core, self._clock, publishers[core.rank] if publishers else None)
            for core in self.cores
        ]
        for driver in self.drivers:
            driver.start()

    def _start_publishers(self) -> list[RankEventPublisher]:
        """One KV event publisher per Rank (sockets bound now, so a taken port fails the startup)."""
        events = self.config.kv_events_config
        if events is None or not self.recorders:
            return []
        publishers: list[RankEventPublisher] = []
        try:
            for rank, recorder in enumerate(self.recorders):
                publishers.append(RankEventPublisher(events, rank, recorder))
        except Exception:
            for publisher in publishers:
                publisher.close_sockets()
            raise
        for publisher in publishers:
            publisher.start()
            log.info("KV events of Rank %d on %s", publisher.rank, publisher.endpoint)
        return publishers

    async def _on_cleanup(self, _app: web.Application) -> None:
        for driver in self.drivers:
            await driver.stop()

    def model_time(self) -> float:
        return self._clock.now() if self._clock is not None else 0.0

    def set_fault(
        self,
        rank: int | None,
        mode: FaultMode | str,
        *,
        slow_factor: float | None = None,
        fail_rate: float | None = None,
    ) -> None:
        """Set a Rank's fault mode (``rank`` None: all), optionally its slow factor and the fail rate."""
        mode = FaultMode(mode)
        targets = self.drivers if rank is None else [self.drivers[rank]]
        for driver in targets:
            driver.set_mode(mode)
            if slow_factor is not None:
                driver.core.slow_factor = slow_factor
        if fail_rate is not None:
            self.fail_rate = fail_rate

    # ---- generation -----------------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completion")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def create_messages(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's ``POST /v1/messages`` as vLLM serves it (see ``engine/anthropic.py``)."""
        try:
            return await self._serve(request, "messages")
        except HTTPError as exc:
            return exc.dialect_response(anthropic_shaped=True)

    async def count_message_tokens(self, request: web.Request) -> web.Response:
        """``POST /v1/messages/count_tokens``: the rendered prompt's length; nothing reaches a Rank."""
        try:
            req = self._parse(anthropic.CountTokensRequest, await self._read_json_body(request))
            prompt = self._chat_prompt(*anthropic.to_chat(req))
        except HTTPError as exc:
            return exc.dialect_response(anthropic_shaped=True)
        return _json(anthropic.count_tokens_body(len(prompt)))

    async def create_response(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's ``POST /v1/responses`` as vLLM serves it (see ``engine/responses.py``)."""
        try:
            return await self._serve(request, "responses")
        except HTTPError as exc:
            return exc.dialect_response(anthropic_shaped=False)

    async def _serve(self, request: web.Request, kind: str) -> web.StreamResponse:
        if kind in ("messages", "responses"):
            body = await self._read_json_body(request)
        else:
            body = await self._read_body(request)
        prepared = self._prepare(kind, body)
        driver = self._pick_driver(request)
        if driver.mode is FaultMode.REFUSE:
            raise HTTPError(503, "This Rank is refusing requests (fault injection)", "ServiceUnavailable")
        if self.fail_rate > 0 and self._fail_rng.random() < self.fail_rate:
            raise HTTPError(500, "Injected failure (--fail-rate)", "InternalServerError")
        prefix = {"completion": "cmpl-", "responses": "resp_"}.get(kind, "chatcmpl-")
        request_id = f"{prefix}{self.config.seed}-{next(self._ids)}"
        try:
            stream = driver.submit(request_id, prepared.prompt, prepared.params, prepared.cache_salt)
        except RequestRejected as exc:
            raise HTTPError(400, str(exc)) from exc
        try:
            if prepared.stream and kind in ("messages", "responses"):
                events = self._event_stream(prepared, stream)
                return await self._stream_events(request, driver, stream, prepared, events)
            if prepared.stream:
                return await self._stream(request, driver, stream, prepared)
            return await self._complete(request, driver, stream, prepared)
        finally:
            if not stream.finished:
                driver.abort(request_id)

    async def _read_body(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise HTTPError(400, f"JSON decode error: {exc}", param="body", validation=True) from exc
        if not isinstance(body, dict):
            raise HTTPError(400, "The request body must be a JSON object", param="body", validation=True)
        return body

    async def _read_json_body(self, request: web.Request) -> dict[str, Any]:
        """As ``_read_body``, refusing a body not sent as ``application/json`` (as vLLM's newer routes do)."""
        if request.content_type != "application/json":
            message = "Unsupported Media Type: Only 'application/json' is allowed"
            raise HTTPError(400, message, validation=True)
        return await self._read_body(request)

    def _parse(self, model_cls: type[_Req], body: dict[str, Any]) -> _Req:
        """Validate ``body`` as ``model_cls`` (400 naming the fields) and check it names our model (404)."""
        try:
            req = model_cls.model_validate(body)
        except ValidationError as exc:
            loc = exc.errors(include_url=False)[0]["loc"] if exc.error_count() else ()
            param = ".".join(["body", *(str(p) for p in loc)])
            raise HTTPError(400, describe(exc), param=param, validation=True) from exc
        model = getattr(req, "model", None)
        if model is not None and model != self.config.model_name:
            raise HTTPError(404, f"The model `{model}` does not exist.", "NotFoundError", param="model")
        return req

    def _chat_prompt(
        self, messages: list[Any], tools: list[Any] | None = None, *, add_generation_prompt: bool = True
    ) -> list[int]:
        """The token ids of the chat template's rendering: chat, Messages, Responses and /tokenize alike."""
        try:
            text = render_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        except ChatTemplateError as exc:
            raise HTTPError(400, str(exc)) from exc
        return self.tokenizer.encode(text)

    def _prepare(self, kind: str, body: dict[str, Any]) -> _Prepared:
        if kind == "messages":
            return self._prepare_messages(body)
        if kind == "responses":
            return self._prepare_responses(body)
        req: CompletionRequest | ChatCompletionRequest
        if kind == "completion":
            req = self._parse(CompletionRequest, body)
        else:
            req = self._parse(ChatCompletionRequest, body)
        if req.n != 1:
            raise HTTPError(400, "n must be 1: the progrouter engine emulator generates one choice")
        if req.stream_options is not None and not req.stream:
            raise HTTPError(400, "Stream options can only be defined when `stream=True`.")
        if isinstance(req, CompletionRequest):
            prompt = self._completion_prompt(req)
            max_tokens = req.max_tokens
        else:
            prompt = self._chat_prompt(
                req.messages, req.tools, add_generation_prompt=req.add_generation_prompt
            )
            max_tokens = req.max_tokens if req.max_completion_tokens is None else req.max_completion_tokens
        params = self._sampling_params(
            len(prompt), max_tokens, min_tokens=req.min_tokens, ignore_eos=req.ignore_eos, seed=req.seed
        )
        opts = req.stream_options
        return _Prepared(
            kind=kind,
            prompt=prompt,
            params=params,
            stream=bool(req.stream),
            include_usage=bool(opts is not None and opts.include_usage),
            continuous_usage=bool(opts is not None and opts.include_usage and opts.continuous_usage_stats),
            cache_salt=req.cache_salt,
        )

    def _prepare_messages(self, body: dict[str, Any]) -> _Prepared:
        req = self._parse(anthropic.MessagesRequest, body)
        prompt = self._chat_prompt(*anthropic.to_chat(req))
        limit = self.config.max_model_len
        if req.max_tokens > limit:
            raise HTTPError(
                400,
                f"max_completion_tokens={req.max_tokens} cannot be greater than max_model_len={limit}. "
                "Please request fewer output tokens.",
                param="max_completion_tokens",
            )
        params = self._sampling_params(len(prompt), req.max_tokens)
        return _Prepared("messages", prompt, params, bool(req.stream), False, False, req.cache_salt)

    def _prepare_responses(self, body: dict[str, Any]) -> _Prepared:
        req = self._parse(responses.ResponsesRequest, body)
        if req.previous_response_id is not None:
            message = f"Response with id '{req.previous_response_id}' not found."
            raise HTTPError(404, message, "invalid_request_error", param="response_id")
        try:
            messages, tools = responses.to_chat(req)
        except responses.InputItemError as exc:
            raise HTTPError(400, str(exc), param="input") from exc
        prompt = self._chat_prompt(messages, tools)
        limit, wanted = self.config.max_model_len, req.max_output_tokens
        if wanted is not None and wanted > limit:
            raise HTTPError(
                400,
                f"max_output_tokens={wanted} cannot be greater than max_model_len={limit}. "
                "Please request fewer output tokens.",
                param="max_output_tokens",
            )
        max_tokens = limit - len(prompt) if wanted is None else min(wanted, limit - len(prompt))
        params = self._sampling_params(len(prompt), max_tokens)
        return _Prepared(
            "responses", prompt, params, bool(req.stream), False, False, req.cache_salt, responses_request=req
        )

    def _completion_prompt(self, req: CompletionRequest) -> list[int]:
        prompt = req.prompt
        if prompt is None or (isinstance(prompt, (str, list)) and len(prompt) == 0):
            raise HTTPError(400, "Either prompt or prompt_embeds must be provided and non-empty.")
        if isinstance(prompt, list) and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise HTTPError(400, "The progrouter engine emulator takes one prompt per request")
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            ids = list(prompt)
            bad = next((t for t in ids if not self.tokenizer.is_valid_id(t)), None)
            if bad is not None:
                raise HTTPError(400, f"Token id {bad} is out of vocabulary")
        if not ids:
            raise HTTPError(400, "The decoder prompt cannot be empty")
        return ids

    def _sampling_params(
        self,
        n_prompt: int,
        max_tokens: int | None,
        *,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        seed: int | None = None,
    ) -> SamplingParams:
        limit = self.config.max_model_len
        if n_prompt >= limit:
            raise HTTPError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your request has "
                f"{n_prompt} input tokens. Please reduce the length of the input messages.",
            )
        if max_tokens is None:
            max_tokens = limit - n_prompt
        if max_tokens < 1:
            raise HTTPError(400, f"max_tokens must be at least 1, got {max_tokens}.")
        if n_prompt + max_tokens > limit:
            raise HTTPError(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                f"context length is {limit} tokens and your request has {n_prompt} input tokens "
                f"({max_tokens} > {limit} - {n_prompt}).",
            )
        if not 0 <= min_tokens <= max_tokens:
            raise HTTPError(
                400, f"min_tokens must be between 0 and max_tokens={max_tokens}, got {min_tokens}."
            )
        return SamplingParams(max_tokens=max_tokens, min_tokens=min_tokens, ignore_eos=ignore_eos, seed=seed)

    def _pick_driver(self, request: web.Request) -> RankDriver:
        header = request.headers.get(DP_RANK_HEADER)
        size = len(self.drivers)
        if header is not None:
            try:
                rank = int(header)
            except ValueError:
                raise HTTPError(400, f"Invalid {DP_RANK_HEADER} header: {header!r}") from None
            if not 0 <= rank < size:
                raise HTTPError(400, f"data_parallel_rank {rank} is out of range [0, {size}).")
            return self.drivers[rank]
        candidates = [d for d in self.drivers if d.mode is not FaultMode.REFUSE] or self.drivers
        return min(candidates, key=lambda d: d.core.load_score())

    # ---- responses ------------------------------------------------------------------------------------

    def _usage(self, prepared: _Prepared, n_out: int, cached: int) -> dict[str, Any]:
        n_prompt = len(prepared.prompt)
        return {
            "prompt_tokens": n_prompt,
            "total_tokens": n_prompt + n_out,
            "completion_tokens": n_out,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    async def _complete(
        self, request: web.Request, driver: RankDriver, stream: RequestStream, prepared: _Prepared
    ) -> web.StreamResponse:
        gen = _Generated()
        while gen.finish_reason is None:
            out = await stream.queue.get()
            self._absorb(gen, out)
            if driver.mode is FaultMode.CUT_STREAMS:
                return _cut(request, web.Response(status=500))
        text = "".join(gen.text)
        if prepared.kind == "messages":
            tokens = self._token_usage(prepared, gen)
            model = self.config.model_name
            return _json(anthropic.message_body(stream.request_id, model, text, gen.finish_reason, tokens))
        if prepared.kind == "responses":
            shape = self._response_shape(prepared, stream)
            item = responses.message_item(self._item_id(stream), text)
            return _json(shape.body([item], gen.finish_reason, self._token_usage(prepared, gen)))
        usage = self._usage(prepared, len(gen.token_ids), gen.num_cached_tokens)
        base = {"id": stream.request_id, "created": int(time.time()), "model": self.config.model_name}
        if prepared.kind == "completion":
            choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None}
            obj = "text_completion"
        else:
            message = {"role": "assistant", "content": text, "tool_calls": []}
            choice = {"index": 0, "message": message, "logprobs": None}
            obj = "chat.completion"
        choice |= {"finish_reason": gen.finish_reason, "stop_reason": None}
        return _json({**base, "object": obj, "choices": [choice], "usage": usage})

    def _token_usage(self, prepared: _Prepared, gen: _Generated) -> TokenUsage:
        n_prompt, block_size = len(prepared.prompt), self.config.block_size
        return TokenUsage.of(n_prompt, gen.num_cached_tokens, len(gen.token_ids), block_size)

    def _response_shape(self, prepared: _Prepared, stream: RequestStream) -> responses.ResponseShape:
        assert prepared.responses_request is not None
        return responses.ResponseShape(
            prepared.responses_request,
            stream.request_id,
            self.config.model_name,
            int(time.time()),
            prepared.params.max_tokens,
        )

    @staticmethod
    def _item_id(stream: RequestStream) -> str:
        return "msg_" + stream.request_id.removeprefix("resp_")

    def _event_stream(self, prepared: _Prepared, stream: RequestStream) -> _EventStream:
        if prepared.kind == "messages":
            return anthropic.MessageStream(stream.request_id, self.config.model_name, len(prepared.prompt))
        return responses.ResponseStream(self._response_shape(prepared, stream), self._item_id(stream))

    async def _stream_events(
        self,
        request: web.Request,
        driver: RankDriver,
        stream: RequestStream,
        prepared: _Prepared,
        events: _EventStream,
    ) -> web.StreamResponse:
        """A Messages or Responses stream: named SSE events, one write per engine step's tokens."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def send(batch: list[tuple[str, dict[str, Any]]]) -> None:
            if batch:
                await resp.write(b"".join(_sse_event(name, data) for name, data in batch))

        await send(events.head())
        gen = _Generated()
        while gen.finish_reason is None:
            out = await stream.queue.get()
            await send(events.tokens("".join(self._absorb(gen, out))))
            if driver.mode is FaultMode.CUT_STREAMS:
                return _cut(request, resp)
        await send(events.finish(gen.finish_reason, self._token_usage(prepared, gen)))
        await resp.write_eof()
        return resp

    def _absorb(self, gen: _Generated, out: RequestOutput) -> list[str]:
        texts = [self.tokenizer.token_text(t) for t in out.new_token_ids]
        gen.token_ids.extend(out.new_token_ids)
        gen.text.extend(texts)
        gen.num_cached_tokens = out.num_cached_tokens
        if out.finish_reason is not None:
            gen.finish_reason = out.finish_reason.value
        return texts

    async def _stream(
        self, request: web.Request, driver: RankDriver, stream: RequestStream, prepared: _Prepared
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        chat = prepared.kind == "chat"
        base = {
            "id": stream.request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.config.model_name,
        }

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(b"data: " + orjson.dumps(obj) + b"\n\n")

        gen = _Generated()
        first = True
        while gen.finish_reason is None:
            out = await stream.queue.get()
            texts = self._absorb(gen, out)
            if chat and first:
                role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
                await send({**base, "choices": [role | {"finish_reason": None}]})
            first = False
            text = "".join(texts)
            if chat:
                choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None}
            else:
                choice = {"index": 0, "text": text, "logprobs": None}
            choice |= {"finish_reason": gen.finish_reason, "stop_reason": None}
            chunk: dict[str, Any] = {**base, "choices": [choice]}
            if prepared.continuous_usage:
                chunk["usage"] = self._usage(prepared, len(gen.token_ids), gen.num_cached_tokens)
            await send(chunk)
            if driver.mode is FaultMode.CUT_STREAMS:
                return _cut(request, resp)
        if prepared.include_usage:
            usage = self._usage(prepared, len(gen.token_ids), gen.num_cached_tokens)
            await send({**base, "choices": [], "usage": usage})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    # ---- the rest of vLLM's surface -------------------------------------------------------------------

    async def health(self, _request: web.Request) -> web.Response:
        if self.drivers and all(d.mode is FaultMode.REFUSE for d in self.drivers):
            return web.Response(status=503)
        return web.Response(status=200)

    async def models(self, _request: web.Request) -> web.Response:
        name = self.config.model_name
        card = {
            "id": name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": name,
            "parent": None,
            "max_model_len": self.config.max_model_len,
            "permission": [],
        }
        return _json({"object": "list", "data": [card]})

    async def server_info(self, _request: web.Request) -> web.Response:
        now = self.model_time()
        ranks = [
            {
                "rank": d.core.rank,
                "fault_mode": d.mode.value,
                "slow_factor": d.core.slow_factor,
                "running": d.core.num_running,
                "waiting": d.core.num_waiting,
                "kv_cache_usage": d.core.kv_cache_usage(),
                "model_lag_seconds": max(0.0, now - (d.core.next_event_time() or now)),
            }
            for d in self.drivers
        ]
        return _json(
            {
                "engine": "progrouter-engine-emulator",
                "config": self.config.to_json_dict(),
                "fail_rate": self.fail_rate,
                "model_time_seconds": now,
                "ranks": ranks,
            }
        )

    async def metrics(self, _request: web.Request) -> web.Response:
        body = render_metrics(self.cores, self.config.model_name)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def tokenize(self, request: web.Request) -> web.Response:
        req = self._parse(TokenizeRequest, await self._read_body(request))
        if req.messages is not None:
            ids = self._chat_prompt(req.messages, req.tools, add_generation_prompt=req.add_generation_prompt)
        elif req.prompt is not None:
            ids = self.tokenizer.encode(req.prompt)
        else:
            raise HTTPError(400, "Either prompt or messages must be provided")
        return _json(
            {"count": len(ids), "max_model_len": self.config.max_model_len, "tokens": ids, "token_strs": None}
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        req = self._parse(DetokenizeRequest, await self._read_body(request))
        bad = next((t for t in req.tokens if not self.tokenizer.is_valid_id(t)), None)
        if bad is not None:
            raise HTTPError(400, f"Token id {bad} is out of vocabulary")
        return _json({"prompt": self.tokenizer.decode(req.tokens)})

    async def reset_prefix_cache(self, _request: web.Request) -> web.Response:
        """vLLM's ``POST /reset_prefix_cache``: every Rank forgets its cached prefixes (409 while busy)."""
        busy = [d.core.rank for d in self.drivers if d.core.kv_cache_usage() > 0]
        if busy:
            raise HTTPError(409, f"Rank(s) {busy} still hold blocks; prefix cache not reset", "ConflictError")
        for driver in self.drivers:
            driver.reset_prefix_cache()
        return web.Response(status=200)

    async def admin_fault(self, request: web.Request) -> web.Response:
        """``POST /admin/fault {"rank": r|null, "mode": ..., "slow_factor": x?, "fail_rate": p?}``."""
        body = await self._read_body(request)
        rank = body.get("rank")
        if rank is not None and (not isinstance(rank, int) or not 0 <= rank < len(self.drivers)):
            raise HTTPError(400, f"rank must be null or an integer in [0, {len(self.drivers)})")
        try:
            mode = FaultMode(body.get("mode", "none"))
        except ValueError:
            raise HTTPError(400, f"mode must be one of {[m.value for m in FaultMode]}") from None
        slow, fail = body.get("slow_factor"), body.get("fail_rate")
        if slow is not None and (not isinstance(slow, (int, float)) or slow <= 0):
            raise HTTPError(400, "slow_factor must be a number > 0")
        if fail is not None and (not isinstance(fail, (int, float)) or not 0 <= fail <= 1):
            raise HTTPError(400, "fail_rate must be a number in [0, 1]")
        self.set_fault(rank, mode, slow_factor=slow, fail_rate=fail)
        log.info("fault injection: rank=%s mode=%s slow_factor=%s fail_rate=%s", rank, mode, slow, fail)
        return await self.admin_fault_status(request)

    async def admin_fault_status(self, _request: web.Request) -> web.Response:
        ranks = [
            {"rank": d.core.rank, "mode": d.mode.value, "slow_factor": d.core.slow_factor}
            for d in self.drivers
        ]
        return _json({"fail_rate": self.fail_rate, "ranks": ranks})


# ---- in-process embedding ---------------------------------------------------------------------------------


@dataclass
class RunningEngine:
    """A started emulator: ``url`` to talk to it, ``server`` to inspect its cores, ``stop()`` to end it."""

    url: str
    port: int
    config: EngineConfig
    server: EngineServer
    _runner: web.AppRunner

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> RunningEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def start_engine(config: EngineConfig) -> RunningEngine:
    """Start an emulator on the running loop (port 0 picks a free port); return once it accepts requests."""
    server = EngineServer(config)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its request.
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    port = _bound_port(runner, config.port)
    return RunningEngine(f"http://{config.host}:{port}", port, config, server, runner)


def _bound_port(runner: web.AppRunner, fallback: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return fallback


async def serve_forever(
    config: EngineConfig, ready: Callable[[RunningEngine], Awaitable[None]] | None = None
) -> None:
    engine = await start_engine(config)
    try:
        if ready is not None:
            await ready(engine)
        await asyncio.Event().wait()
    finally:
        await engine.stop()
