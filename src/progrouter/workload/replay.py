"""Closed-loop replay of an agent trace against a router or an engine.

Each Program runs as its own loop: request *i+1* is sent once request *i* has completed and its gap has
passed. A subagent starts after the parent request it was spawned from completes (plus its own first gap) and
runs concurrently with everything else; a parent waits for its blocking subagents before its next request
(it sends at the later of its own gap and their end). Tasks start at their ``start`` (optionally limited to
``max_concurrent_tasks`` at once).

``time_scale`` compresses time the way the engine emulator's ``--time-scale`` does: a trace gap of *g*
modelled seconds is waited as *g / time_scale* wall seconds; facts stay in wall seconds and record the scale.

``api`` picks the wire shape (``progrouter.workload.apis``): ``completions`` and ``chat`` carry the Program
identity as ``vllm_xargs.agentic_context`` and the task as ``x-session-id``; ``messages`` (Claude Code) and
``responses`` (Codex CLI) send each Program's turns as a conversation with tool calls and carry identity only
in that harness's headers. Every shape streams and asks for exactly the trace's output tokens. Stopping
(``stop`` set, or the caller cancelling) cancels what is in flight; facts already handed to ``sink`` are
complete, in-flight requests are reported as ``cancelled``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import orjson

from progrouter.workload.apis import ApiName, RenderInput, make_client
from progrouter.workload.apis.base import StreamReader
from progrouter.workload.facts import Fact
from progrouter.workload.prompts import PromptBuilder
from progrouter.workload.trace import Trace, TraceProgram, TraceRequest, TraceTask

Api = ApiName
#: Response headers a router may use to say which Rank served a request (first present wins).
RANK_HEADERS = ("x-progrouter-rank", "x-data-parallel-rank")
TARGET_HEADERS = ("x-progrouter-target",)


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    url: str
    api: Api = "completions"
    model: str | None = None
    time_scale: float = 1.0
    max_connections: int = 256
    max_concurrent_tasks: int | None = None
    vocab_size: int = 32_000
    salt: str = "progrouter"
    request_timeout: float = 3600.0
    headers: Mapping[str, str] = field(default_factory=dict)
    kv_retention_hint: float | None = None  # trace seconds every request asks the router to retain its KV


@dataclass(slots=True)
class ReplayResult:
    facts: list[Fact]
    task_start: dict[str, float]
    task_end: dict[str, float]
    interrupted: bool
    wall_seconds: float


Sink = Callable[[Fact], None]


async def resolve_model(session: aiohttp.ClientSession, url: str) -> str | None:
    """The first model the server lists, or None if it lists none or cannot be asked."""
    try:
        async with session.get(f"{url}/v1/models") as resp:
            if resp.status != 200:
                return None
            data = await resp.json(loads=orjson.loads)
            models = data.get("data") or []
            return str(models[0]["id"]) if models else None
    except (aiohttp.ClientError, ValueError, KeyError, TypeError):
        return None


class _Replayer:
    def __init__(self, trace: Trace, opts: ReplayOptions, sink: Sink, session: aiohttp.ClientSession) -> None:
        self.trace = trace
        self.opts = opts
        self.sink = sink
        self.session = session
        self.prompts = PromptBuilder(trace, salt=opts.salt, vocab_size=opts.vocab_size)
        self.model = opts.model or "default"
        self.t0 = time.perf_counter()
        self.facts: list[Fact] = []
        self.task_start: dict[str, float] = {}
        self.task_end: dict[str, float] = {}
        self.slots = asyncio.Semaphore(opts.max_concurrent_tasks) if opts.max_concurrent_tasks else None
        hint = opts.kv_retention_hint  # in wall seconds, as the router's config (scaled_program_config)
        self.client = make_client(
            opts.api, trace, self.prompts, self.model,
            kv_retention_hint=None if hint is None else hint / opts.time_scale,
        )  # fmt: skip

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def sleep_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            await asyncio.sleep(delay)

    async def run_task(self, task: TraceTask) -> None:
        await self.sleep_until(task.start / self.opts.time_scale)
        if self.slots is not None:
            async with self.slots:
                await self._task_body(task)
        else:
            await self._task_body(task)

    async def _task_body(self, task: TraceTask) -> None:
        start = self.task_start[task.task_id] = self.now()
        try:
            await self.run_program(task, task.lead, start)
        finally:
            self.task_end[task.task_id] = self.now()
            self.client.forget(task.task_id)
            self.prompts.forget(task.task_id)

    async def run_program(self, task: TraceTask, program: TraceProgram, spawned_at: float) -> None:
        children = task.children(program.program_id)
        running: list[asyncio.Task[None]] = []
        blocking: list[asyncio.Task[None]] = []

        def spawn(after: int, at: float) -> None:
            for child in children:
                if child.spawn_after == after:
                    t = asyncio.create_task(self.run_program(task, child, at))
                    running.append(t)
                    if child.blocks_parent:
                        blocking.append(t)

        try:
            spawn(-1, spawned_at)
            prev_done = spawned_at
            for step, request in enumerate(program.requests):
                await self.sleep_until(prev_done + request.gap / self.opts.time_scale)
                if blocking:
                    await asyncio.gather(*blocking)
                    blocking.clear()
                await self.send(task, program, step, request)
                prev_done = self.now()
                spawn(step, prev_done)
            if running:
                await asyncio.gather(*running)
        finally:
            for t in running:
                t.cancel()

    async def send(self, task: TraceTask, program: TraceProgram, step: int, request: TraceRequest) -> None:
        ready = self.now()
        rendered = self.client.render(
            RenderInput(task, program, step, request, f"{program.program_id}:{step}")
        )
        headers = _merged(rendered.headers, self.opts.headers)
        fact = Fact.start(
            task,
            program,
            step,
            task_start=self.task_start[task.task_id],
            ready_at=ready,
            started_at=self.now(),
            time_scale=self.opts.time_scale,
        )
        try:
            url = f"{self.opts.url}{rendered.path}"
            async with self.session.post(url, data=rendered.body, headers=headers) as resp:
                fact.headers_at = self.now()
                fact.status_code = resp.status
                _read_rank(resp.headers, fact)
                if resp.status != 200:
                    fact.status = "error"
                    fact.error = (await resp.text())[:300]
                else:
                    await _read_stream(resp, fact, self.now, self.client.reader())
        except asyncio.CancelledError:
            fact.status = "cancelled"
            fact.finished_at = self.now()
            self._emit(fact)
            raise
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            fact.status = "error"
            fact.error = f"{type(exc).__name__}: {exc}"[:300]
        fact.finished_at = self.now()
        self._emit(fact)

    def _emit(self, fact: Fact) -> None:
        self.facts.append(fact)
        self.sink(fact)


def _merged(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """``base`` with ``extra`` on top, header names compared without case (one value per name)."""
    override = {k.lower() for k in extra}
    return {**{k: v for k, v in base.items() if k.lower() not in override}, **extra}


def _read_rank(headers: Mapping[str, str], fact: Fact) -> None:
    for name in RANK_HEADERS:
        value = headers.get(name)
        if value is not None and value.strip().isdigit():
            fact.rank = int(value)
            break
    for name in TARGET_HEADERS:
        value = headers.get(name)
        if value:
            fact.target = value
            break


async def _read_stream(
    resp: aiohttp.ClientResponse, fact: Fact, now: Callable[[], float], reader: StreamReader
) -> None:
    """Consume an SSE answer: first-content time, usage, and whether it ended properly."""
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue  # ``event:`` lines repeat the ``type`` every harness event carries
        payload = line[5:].strip()
        if reader.end_marker(payload):
            continue  # keep reading to the end: closing early looks like a client disconnect upstream
        obj = orjson.loads(payload)
        if isinstance(obj, dict) and reader.feed(obj) and fact.first_token_at is None:
            fact.first_token_at = now()
    usage = reader.usage
    fact.prompt_tokens = usage.prompt_tokens if usage.prompt_tokens is not None else fact.prompt_tokens
    fact.output_tokens = usage.output_tokens
    fact.cached_tokens = usage.cached_tokens
    if fact.output_tokens is None and reader.content_events:
        fact.output_tokens = reader.content_events
    if reader.error is not None:
        fact.status = "error"
        fact.error = reader.error
    elif not reader.done and fact.status == "ok":
        fact.status = "error"
        fact.error = "stream ended before its final event"


async def replay(
    trace: Trace,
    opts: ReplayOptions,
    sink: Sink = lambda _f: None,
    stop: asyncio.Event | None = None,
) -> ReplayResult:
    """Replay ``trace``; returns when every task is done, or early (``interrupted``) when ``stop`` is set."""
    connector = aiohttp.TCPConnector(limit=opts.max_connections)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30.0, sock_read=opts.request_timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        if opts.model is None:
            opts = replace(opts, model=await resolve_model(session, opts.url) or "default")
        r = _Replayer(trace, opts, sink, session)
        work = asyncio.ensure_future(asyncio.gather(*(r.run_task(t) for t in trace.tasks)))
        waiters: set[asyncio.Future[Any]] = {work}
        stopper: asyncio.Task[bool] | None = None
        if stop is not None:
            stopper = asyncio.create_task(stop.wait())
            waiters.add(stopper)
        interrupted = False
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not work.done():
                interrupted = True
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
            if stopper is not None:
                stopper.cancel()
        failure = None if interrupted or work.cancelled() else work.exception()
        if failure is not None:
            raise failure
        return ReplayResult(r.facts, r.task_start, r.task_end, interrupted, r.now())
