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
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

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

_Req = TypeVar("_Req", bound=BaseModel)
log = logging.getLogger(__name__)

DP_RANK_HEADER = "X-data-parallel-rank"


class FaultMode(StrEnum):
    NONE = "none"
    REFUSE = "refuse"  # new requests to the Rank get 503
    STALL = "stall"  # the Rank stops stepping; its requests hang until the mode changes
    CUT_STREAMS = "cut_streams"  # every response of the Rank is cut off after its next token


class HTTPError(Exception):
    """An error answer in vLLM's ErrorResponse shape."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type

    def response(self) -> web.Response:
        return _json(error_body(str(self), status=self.status, err_type=self.err_type), status=self.status)


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

    kind: str  # "completion" | "chat"
    prompt: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    continuous_usage: bool
    cache_salt: str | None


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

    async def _serve(self, request: web.Request, kind: str) -> web.StreamResponse:
        body = await self._read_body(request)
        prepared = self._prepare(kind, body)
        driver = self._pick_driver(request)
        if driver.mode is FaultMode.REFUSE:
            raise HTTPError(503, "This Rank is refusing requests (fault injection)", "ServiceUnavailable")
        if self.fail_rate > 0 and self._fail_rng.random() < self.fail_rate:
            raise HTTPError(500, "Injected failure (--fail-rate)", "InternalServerError")
        prefix = "cmpl" if kind == "completion" else "chatcmpl"
        request_id = f"{prefix}-{self.config.seed}-{next(self._ids)}"
        try:
            stream = driver.submit(request_id, prepared.prompt, prepared.params, prepared.cache_salt)
        except RequestRejected as exc:
            raise HTTPError(400, str(exc)) from exc
        try:
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
            raise HTTPError(400, f"JSON decode error: {exc}") from exc
        if not isinstance(body, dict):
            raise HTTPError(400, "The request body must be a JSON object")
        return body

    def _parse(self, model_cls: type[_Req], body: dict[str, Any]) -> _Req:
        """Validate ``body`` as ``model_cls`` (400 naming the fields) and check it names our model (404)."""
        try:
            req = model_cls.model_validate(body)
        except ValidationError as exc:
            raise HTTPError(400, describe(exc)) from exc
        model = getattr(req, "model", None)
        if model is not None and model != self.config.model_name:
            raise HTTPError(404, f"The model `{model}` does not exist.", "NotFoundError")
        return req

    def _prepare(self, kind: str, body: dict[str, Any]) -> _Prepared:
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
            try:
                text = render_chat(req.messages, add_generation_prompt=req.add_generation_prompt)
            except ChatTemplateError as exc:
                raise HTTPError(400, str(exc)) from exc
            prompt = self.tokenizer.encode(text)
            max_tokens = req.max_tokens if req.max_completion_tokens is None else req.max_completion_tokens
        params = self._sampling_params(req, len(prompt), max_tokens)
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
        self, req: CompletionRequest | ChatCompletionRequest, n_prompt: int, max_tokens: int | None
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
        if not 0 <= req.min_tokens <= max_tokens:
            raise HTTPError(
                400, f"min_tokens must be between 0 and max_tokens={max_tokens}, got {req.min_tokens}."
            )
        return SamplingParams(
            max_tokens=max_tokens, min_tokens=req.min_tokens, ignore_eos=req.ignore_eos, seed=req.seed
        )

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
            try:
                text = render_chat(req.messages, add_generation_prompt=req.add_generation_prompt)
            except ChatTemplateError as exc:
                raise HTTPError(400, str(exc)) from exc
        elif req.prompt is not None:
            text = req.prompt
        else:
            raise HTTPError(400, "Either prompt or messages must be provided")
        ids = self.tokenizer.encode(text)
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
