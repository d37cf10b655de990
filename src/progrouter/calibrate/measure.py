"""Measure cold prefill and warm-prefix decode on a live vLLM-compatible backend (the I/O half of calibrate).

Prefill: one request at a time, unique random token ids (so no prefix can hit), ``max_tokens=1``, streamed;
the sample is the time to the first token, x = ``prompt_tokens - cached_tokens`` from ``usage`` (and the
cached count is checked to be 0). Token ids make every length exact; a server that rejects them gets text.

Decode: for each batch size B and per-request context L, B unique prompts are first prefilled once (so the
timed requests hit their own warm prefix and start decoding in the same engine step), then sent together,
streamed, each generating N tokens (``min_tokens = max_tokens = N``, ``ignore_eos``). A request's step time
is the slope of its token arrival times over the window in which the whole batch decoded; the sample is the
median over the batch, with context ``C = Σ (prompt_i + N/2)`` — the average full context summed over the
batch while it decodes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import orjson

from progrouter.observe.vllm_metrics import kv_capacities
from progrouter.routing.target import Target

# Token ids are drawn from this range: above the special tokens of common vocabularies, below any vocabulary
# size a served model plausibly has.
TOKEN_ID_LOW = 100
TOKEN_ID_HIGH = 4000

IDLE_CONNECTION_SECONDS = 2.0  # below the 5 s keep-alive of vLLM's server


class CalibrationError(RuntimeError):
    """The backend cannot be measured; the message says why, for the operator."""


ProgressFn = Callable[[int, str], None]


@dataclass(frozen=True)
class Plan:
    """What to measure. Defaults suit a small real model on CPU; a GPU deployment wants longer prompts."""

    prefill_lengths: tuple[int, ...] = (256, 512, 1024, 2048, 3072, 4096)
    prefill_repeats: int = 3
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    decode_contexts: tuple[int, ...] = (256, 1024, 2048)
    decode_tokens: int = 32
    decode_repeats: int = 1
    # A batch whose timing was disturbed (see ``disturbance``) is measured again, up to this many times.
    decode_attempts: int = 3
    warmup_requests: int = 2
    seed: int = 0
    request_timeout_seconds: float = 300.0
    # Measured wall seconds are multiplied by this: for an emulator run with --time-scale X, pass X.
    time_scale: float = 1.0

    def request_count(self) -> int:
        prefill = len(self.prefill_lengths) * self.prefill_repeats
        decode = sum(2 * b for b in self.batch_sizes) * len(self.decode_contexts) * self.decode_repeats
        warmup = self.warmup_requests + (2 * max(self.batch_sizes) if self.warmup_requests else 0)
        return warmup + prefill + decode


@dataclass(frozen=True)
class PrefillSample:
    requested_tokens: int
    prompt_tokens: int
    cached_tokens: int | None
    seconds: float
    e2e_seconds: float

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - (self.cached_tokens or 0)


@dataclass(frozen=True)
class DecodeSample:
    batch_size: int
    requested_context_tokens: int
    prompt_tokens: tuple[int, ...]
    cached_tokens: tuple[int | None, ...]
    new_tokens: int
    context_tokens: float
    step_seconds: float
    per_request_step_seconds: tuple[float, ...]


@dataclass
class Measurement:
    url: str
    model: str
    prompt_mode: str
    max_model_len: int | None
    kv_capacity_tokens: int | None
    plan: Plan
    prefill: list[PrefillSample] = field(default_factory=list)
    decode: list[DecodeSample] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    started_at: float = 0.0
    wall_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "model": self.model,
            "prompt_mode": self.prompt_mode,
            "max_model_len": self.max_model_len,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "plan": asdict(self.plan),
            "prefill": [asdict(s) | {"uncached_tokens": s.uncached_tokens} for s in self.prefill],
            "decode": [asdict(s) for s in self.decode],
            "warnings": list(self.warnings),
            "wall_seconds": self.wall_seconds,
        }


@dataclass(frozen=True)
class StreamResult:
    """One streamed request: times relative to its send, plus (monotonic time, tokens so far) per chunk."""

    first_token_at: float
    done_at: float
    chunks: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    points: tuple[tuple[float, int], ...]


class Backend:
    """One vLLM-compatible server (optionally one DP Rank of it, ``http://h:p@rank``)."""

    def __init__(
        self, session: aiohttp.ClientSession, target: Target, *, api_key: str | None, timeout: float
    ):
        self.session = session
        self.target = target
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.headers = {"Content-Type": "application/json", **target.headers()}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.model = ""
        self.prompt_mode = "token_ids"

    def _url(self, path: str) -> str:
        return self.target.base_url + path

    async def get_json(self, path: str) -> Any:
        try:
            async with self.session.get(self._url(path), headers=self.headers, timeout=self.timeout) as resp:
                body = await resp.read()
                if resp.status >= 400:
                    raise CalibrationError(_http_error(self._url(path), resp.status, body))
                return json.loads(body)
        except aiohttp.ClientConnectorError as exc:
            raise CalibrationError(f"cannot reach the backend at {self.target.base_url}: {exc}") from exc
        except TimeoutError as exc:
            raise CalibrationError(f"{self._url(path)} did not answer within {self.timeout.total} s") from exc
        except (aiohttp.ClientError, json.JSONDecodeError) as exc:
            raise CalibrationError(f"{self._url(path)}: {exc}") from exc

    async def get_text(self, path: str) -> str | None:
        """Best effort (used for /metrics): None when unavailable."""
        try:
            async with self.session.get(self._url(path), timeout=self.timeout) as resp:
                return (await resp.text()) if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def complete(
        self, prompt: list[int] | str, max_tokens: int, *, exact: bool = False
    ) -> StreamResult:
        """One streamed /v1/completions request; timestamps are monotonic wall seconds."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
            # continuous_usage_stats: a running completion_tokens in every chunk, so a chunk that carries
            # several tokens (a server coalescing output for a slow reader) is counted right.
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if exact:
            body |= {"min_tokens": max_tokens, "ignore_eos": True}
        url = self._url("/v1/completions")
        payload = orjson.dumps(body)  # encoded before the clock starts: the client's encoding is no TTFT
        start = time.monotonic()
        first = 0.0
        chunks = 0
        points: list[tuple[float, int]] = []
        usage: dict[str, Any] | None = None
        try:
            post = self.session.post(url, data=payload, headers=self.headers, timeout=self.timeout)
            async with post as resp:
                if resp.status >= 400:
                    raise _RequestRejected(resp.status, await resp.read())
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    event = json.loads(data)
                    if "error" in event:
                        raise CalibrationError(f"{url} failed mid-stream: {_error_message(event)}")
                    now = time.monotonic()
                    if event.get("usage"):
                        usage = event["usage"]
                    if event.get("choices"):
                        chunks += 1
                        first = first or now
                        running = (usage or {}).get("completion_tokens") if event.get("usage") else None
                        points.append((now, int(running) if isinstance(running, int) else chunks))
        except aiohttp.ClientConnectorError as exc:
            raise CalibrationError(f"cannot reach the backend at {self.target.base_url}: {exc}") from exc
        except TimeoutError as exc:
            raise CalibrationError(f"{url} did not answer within {self.timeout.total} s") from exc
        except aiohttp.ClientError as exc:
            raise CalibrationError(f"{url}: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise CalibrationError(f"{url} streamed something that is not JSON: {exc}") from exc
        done = time.monotonic()
        if usage is None:
            raise CalibrationError(
                f"{url} sent no usage (the backend must honour stream_options.include_usage)"
            )
        if chunks == 0:
            raise CalibrationError(f"{url} streamed no tokens")
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        return StreamResult(
            first_token_at=first - start,
            done_at=done - start,
            chunks=chunks,
            points=tuple(points),
            prompt_tokens=int(usage["prompt_tokens"]),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            cached_tokens=None if cached is None else int(cached),
        )


class _RequestRejected(Exception):
    def __init__(self, status: int, body: bytes):
        super().__init__(status)
        self.status = status
        self.body = body


def _error_message(payload: Any) -> str:
    if isinstance(payload, dict):
        err = payload.get("error", payload)
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(err)
    return str(payload)


def _http_error(url: str, status: int, body: bytes) -> str:
    try:
        message = _error_message(json.loads(body))
    except (json.JSONDecodeError, UnicodeDecodeError):
        message = body[:300].decode("utf-8", "replace")
    return f"{url} answered HTTP {status}: {message}"


class PromptFactory:
    """Unique prompts of a requested token length: random token ids, or random words in text mode."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.tokens_per_word = 1.0

    def ids(self, n: int) -> list[int]:
        return [self.rng.randrange(TOKEN_ID_LOW, TOKEN_ID_HIGH) for _ in range(n)]

    def text(self, n_tokens: int) -> str:
        words = max(1, round(n_tokens / self.tokens_per_word))
        letters = "abcdefghijklmnopqrstuvwxyz"
        return " ".join("".join(self.rng.choice(letters) for _ in range(5)) for _ in range(words))


async def _discover(backend: Backend, model: str | None) -> tuple[str, int | None]:
    listing = await backend.get_json("/v1/models")
    served = [m for m in listing.get("data", []) if isinstance(m, dict) and "id" in m]
    if not served:
        raise CalibrationError(f"{backend.target.base_url}/v1/models lists no model")
    names = [str(m["id"]) for m in served]
    if model is None:
        chosen = served[0]
    else:
        match = [m for m in served if m["id"] == model]
        if not match:
            raise CalibrationError(
                f"model {model!r} is not served at {backend.target.base_url}; it serves {names}"
            )
        chosen = match[0]
    max_len = chosen.get("max_model_len")
    return str(chosen["id"]), int(max_len) if isinstance(max_len, int) else None


async def _choose_prompt_mode(backend: Backend, prompts: PromptFactory) -> None:
    """Token ids when accepted; otherwise text, with the words-to-tokens ratio measured once."""
    try:
        await backend.complete(prompts.ids(64), 1)
        backend.prompt_mode = "token_ids"
        return
    except _RequestRejected as exc:
        if exc.status != 400:
            raise CalibrationError(
                _http_error(backend._url("/v1/completions"), exc.status, exc.body)
            ) from exc
    backend.prompt_mode = "text"
    text = prompts.text(200)
    try:
        result = await backend.complete(text, 1)
    except _RequestRejected as exc:
        raise CalibrationError(_http_error(backend._url("/v1/completions"), exc.status, exc.body)) from exc
    prompts.tokens_per_word = max(0.1, result.prompt_tokens / len(text.split()))


def _prompt(backend: Backend, prompts: PromptFactory, n_tokens: int) -> list[int] | str:
    return prompts.ids(n_tokens) if backend.prompt_mode == "token_ids" else prompts.text(n_tokens)


async def _send(backend: Backend, prompts: PromptFactory, n_tokens: int, max_tokens: int) -> StreamResult:
    return await _complete(backend, _prompt(backend, prompts, n_tokens), max_tokens)


async def measure(
    url: str,
    plan: Plan,
    *,
    model: str | None = None,
    api_key: str | None = None,
    progress: ProgressFn | None = None,
) -> Measurement:
    """Run the whole plan against ``url`` (``http://host:port`` or ``http://host:port@rank``)."""
    target = Target.parse(url)
    tick: ProgressFn = progress or (lambda _n, _d: None)
    scale = plan.time_scale
    # vLLM's server (uvicorn) closes an idle connection after 5 s; aiohttp keeps one 15 s by default, so a
    # POST after a longer pause could go out on a connection the server is closing ("Server disconnected",
    # seen in the real-vLLM tier). Drop idle connections first.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=IDLE_CONNECTION_SECONDS)
    async with aiohttp.ClientSession(connector=connector) as session:
        backend = Backend(session, target, api_key=api_key, timeout=plan.request_timeout_seconds)
        backend.model, max_len = await _discover(backend, model)
        metrics = await backend.get_text("/metrics")
        capacity = kv_capacities(metrics).get(target.rank) if metrics else None
        result = Measurement(url, backend.model, "token_ids", max_len, capacity, plan, started_at=time.time())
        t0 = time.monotonic()
        prompts = PromptFactory(plan.seed)
        tick(0, "probing prompt format")
        await _choose_prompt_mode(backend, prompts)
        result.prompt_mode = backend.prompt_mode
        if backend.prompt_mode == "text":
            result.warnings.append(
                "the backend rejected token-id prompts; text prompts used (lengths approximate)"
            )
        for _ in range(plan.warmup_requests):
            await _send(backend, prompts, min(plan.prefill_lengths), 1)
            tick(1, "warm-up")
        warm_b, warm_c = max(plan.batch_sizes), min(plan.decode_contexts)
        fits = capacity is None or warm_b * (warm_c + plan.decode_tokens) <= 0.8 * capacity
        if plan.warmup_requests and fits:  # a fresh server's first decode batches run slow (kernel set-up)
            await _timed_batch(backend, prompts, plan, warm_b, warm_c, tick)

        await _measure_prefill(backend, prompts, plan, result, tick)
        await _measure_decode(backend, prompts, plan, result, tick)
        result.wall_seconds = time.monotonic() - t0
    if scale != 1.0:
        result.warnings.append(f"measured wall times multiplied by time_scale={scale}")
    return result


async def _measure_prefill(
    backend: Backend, prompts: PromptFactory, plan: Plan, result: Measurement, tick: ProgressFn
) -> None:
    limit = (result.max_model_len or 1 << 62) - 1
    lengths = [n for n in plan.prefill_lengths if n <= limit]
    for skipped in sorted(set(plan.prefill_lengths) - set(lengths)):
        result.warnings.append(
            f"prefill length {skipped} skipped: longer than max_model_len {result.max_model_len}"
        )
    jobs = [n for n in lengths for _ in range(plan.prefill_repeats)]
    random.Random(plan.seed + 1).shuffle(jobs)  # spread slow drift over all lengths
    hits = 0
    for n in jobs:
        r = await _send(backend, prompts, n, 1)
        if r.cached_tokens:
            hits += 1
        result.prefill.append(
            PrefillSample(
                n,
                r.prompt_tokens,
                r.cached_tokens,
                r.first_token_at * plan.time_scale,
                r.done_at * plan.time_scale,
            )
        )
        tick(1, f"cold prefill {n} tokens")
    if result.prefill and all(s.cached_tokens is None for s in result.prefill):
        result.warnings.append(
            "the backend reports no usage.prompt_tokens_details.cached_tokens (start vLLM with "
            "--enable-prompt-tokens-details): cold prefill could not be verified"
        )
    if hits:
        result.warnings.append(
            f"{hits} cold-prefill samples hit the prefix cache; their cached tokens were excluded"
        )


async def _measure_decode(
    backend: Backend, prompts: PromptFactory, plan: Plan, result: Measurement, tick: ProgressFn
) -> None:
    n_new = plan.decode_tokens
    if n_new < 2:
        raise CalibrationError("decode measurement needs at least 2 generated tokens per request")
    grid = [
        (b, c) for b in plan.batch_sizes for c in plan.decode_contexts for _ in range(plan.decode_repeats)
    ]
    random.Random(plan.seed + 2).shuffle(grid)
    for batch, context in grid:
        if result.max_model_len is not None and context + n_new > result.max_model_len:
            result.warnings.append(f"decode context {context} skipped: exceeds max_model_len")
            tick(2 * batch, "skipped")
            continue
        need = batch * (context + n_new)
        if result.kv_capacity_tokens is not None and need > 0.8 * result.kv_capacity_tokens:
            result.warnings.append(
                f"decode B={batch} context={context} skipped: needs {need} KV tokens, "
                f"over 80% of the Rank's {result.kv_capacity_tokens}"
            )
            tick(2 * batch, "skipped")
            continue
        runs, steps, trouble = await _timed_batch(backend, prompts, plan, batch, context, tick)
        for attempt in range(2, plan.decode_attempts + 1):
            if trouble is None:
                break
            result.warnings.append(f"decode B={batch} context={context}: {trouble}; measuring again")
            runs, steps, trouble = await _timed_batch(backend, prompts, plan, batch, context, tick, attempt)
        if trouble is not None:
            result.warnings.append(f"decode B={batch} context={context}: {trouble}; kept (median used)")
        total_context = sum(r.prompt_tokens + r.completion_tokens / 2 for r in runs)
        result.decode.append(
            DecodeSample(
                batch_size=batch,
                requested_context_tokens=context,
                prompt_tokens=tuple(r.prompt_tokens for r in runs),
                cached_tokens=tuple(r.cached_tokens for r in runs),
                new_tokens=n_new,
                context_tokens=total_context,
                step_seconds=statistics.median(steps),
                per_request_step_seconds=tuple(steps),
            )
        )
        cold = [r for r in runs if r.cached_tokens is not None and r.cached_tokens < r.prompt_tokens // 2]
        if cold:
            result.warnings.append(
                f"decode B={batch} context={context}: {len(cold)} request(s) found no warm prefix "
                "(KV too small?)"
            )


def common_window_steps(streams: Sequence[Sequence[tuple[float, int]]]) -> list[float]:
    """Per-request decode step seconds, measured only while every request of the batch was decoding.

    Requests sent together may start decoding a step or two apart (the last one's prefill tail then rides
    in the others' steps) and stop apart. Between the last first-token and the first last-token every step
    decodes the whole batch, so each request's step is the least-squares slope of time against tokens over
    its points in that window (every point counts, so one late wake-up of the server or the client at either
    end moves it little); a request with less than half its tokens there (the batch never really decoded
    together) falls back to its whole stream.
    """
    w0 = max(pts[0][0] for pts in streams)
    w1 = min(pts[-1][0] for pts in streams)
    out = []
    for pts in streams:
        inside = [p for p in pts if w0 <= p[0] <= w1]
        if len(inside) < 2 or 2 * (inside[-1][1] - inside[0][1]) < pts[-1][1] - pts[0][1]:
            inside = list(pts)
        out.append(_slope(inside))
    return out


def _slope(points: Sequence[tuple[float, int]]) -> float:
    """Seconds per token: the least-squares slope of arrival time against the running token count."""
    n_mean = statistics.fmean(n for _, n in points)
    t_mean = statistics.fmean(t for t, _ in points)
    spread = sum((n - n_mean) ** 2 for _, n in points)
    if spread == 0:
        return 0.0
    return sum((n - n_mean) * (t - t_mean) for t, n in points) / spread


async def _timed_batch(
    backend: Backend,
    prompts: PromptFactory,
    plan: Plan,
    batch: int,
    context: int,
    tick: ProgressFn,
    attempt: int = 1,
) -> tuple[list[StreamResult], list[float], str | None]:
    """Warm B fresh prompts, then decode them together; per-request steps and what disturbed them, if any."""
    label = f"decode B={batch} ctx={context}" + (f" (attempt {attempt})" if attempt > 1 else "")
    batch_prompts = [_prompt(backend, prompts, context) for _ in range(batch)]
    for p in batch_prompts:  # warm each prefix so the timed requests decode together
        await _complete(backend, p, 1)
        tick(1 if attempt == 1 else 0, f"{label}: warming")
    runs = await asyncio.gather(*(_complete(backend, p, plan.decode_tokens) for p in batch_prompts))
    tick(batch if attempt == 1 else 0, label)
    for r in runs:
        if r.completion_tokens < 2 or r.chunks < 2:
            raise CalibrationError(
                f"the backend generated {r.completion_tokens} tokens where {plan.decode_tokens} were asked "
                "(it must honour min_tokens/ignore_eos)"
            )
    steps = [s * plan.time_scale for s in common_window_steps([r.points for r in runs])]
    return list(runs), steps, disturbance(runs, steps)


def disturbance(runs: Sequence[StreamResult], steps: Sequence[float]) -> str | None:
    """Why a batch's timing cannot be trusted, or None.

    A starved API server delivers several tokens per chunk (continuous usage shows the jump) and in bursts, so
    the arrival times no longer follow the engine's steps; and requests of one batch share every step, so
    their per-request estimates must agree.
    """
    tokens = sum(r.points[-1][1] - r.points[0][1] for r in runs)
    coalesced = sum(_coalesced(r.points) for r in runs)
    if tokens > 0 and coalesced > 0.25 * tokens:
        return f"{coalesced} of {tokens} tokens arrived several per chunk (a starved or slow server)"
    if any(_bursty(r.points) for r in runs):
        return "tokens arrived in bursts (the client or the server was starved of CPU)"
    if min(steps) <= 0 or max(steps) > 2.0 * min(steps):
        return "per-request step times disagree by more than 2x"
    return None


def _bursty(points: Sequence[tuple[float, int]]) -> bool:
    """A steady stream has a median gap near its mean step; a stream read in bursts has gaps near zero."""
    gaps = [(b[0] - a[0]) / (b[1] - a[1]) for a, b in itertools.pairwise(points) if b[1] > a[1]]
    if len(gaps) < 4:
        return False
    mean = (points[-1][0] - points[0][0]) / max(1, points[-1][1] - points[0][1])
    return statistics.median(gaps) < 0.5 * mean


def _coalesced(points: Sequence[tuple[float, int]]) -> int:
    return sum(b[1] - a[1] for a, b in itertools.pairwise(points) if b[1] - a[1] > 1)


async def _complete(backend: Backend, prompt: list[int] | str, max_tokens: int) -> StreamResult:
    try:
        return await backend.complete(prompt, max_tokens, exact=max_tokens > 1)
    except _RequestRejected as exc:
        raise CalibrationError(_http_error(backend._url("/v1/completions"), exc.status, exc.body)) from exc


def summarize_warnings(warnings: Sequence[str]) -> list[str]:
    """Deduplicated, in first-seen order."""
    return list(dict.fromkeys(warnings))
