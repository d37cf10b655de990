"""EngineCore: one data-parallel Rank of the emulated vLLM engine, sans-I/O.

Theory of operation: the caller owns the clock. ``add_request(..., now)`` queues a request that arrived at
``now``; ``step(now)`` runs one engine step that starts at ``now`` — schedule, charge the modelled step time,
sample one token for every request whose computed tokens caught up — and returns what happened, stamped with
the step's end. ``next_event_time()`` says when the next step should start (None when idle). A step is atomic:
its outputs become visible at ``StepResult.end``, and the next step may start no earlier. Requests that
arrive in the model's future are not admitted before their arrival time, so a driver that runs behind the
wall clock stays causal. No asyncio, no wall clock, no I/O: the server and the simulator drive the same code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from progrouter.engine.block_pool import KVEventSink
from progrouter.engine.config import EngineConfig
from progrouter.engine.cost import StepCostModel
from progrouter.engine.kv_cache_manager import KVCacheManager
from progrouter.engine.request import FinishReason, PromptBlocks, Request, RequestStatus, SamplingParams
from progrouter.engine.scheduler import EngineScheduler
from progrouter.engine.stats import EngineStats


class RequestRejected(ValueError):
    """The core cannot take this request (duplicate id, empty prompt, longer than ``max_model_len``)."""


class RequestOutput(NamedTuple):
    """What one request got from one step: at most one new token, and whether it is done (a named tuple:
    every running request gets one each step, and a tuple is built four times faster than a frozen
    dataclass). A block-mode request (``PromptBlocks``: its tokens are counted, never read) reports only
    its first token and its finish."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    first_token: bool

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class PlainRun:
    """``steps`` plain steps from ``start``: ``batch`` requests decode (the first step at ``context`` tokens)
    and, when ``chunk`` > 0, the last running request prefills ``chunk`` uncached tokens a step from
    ``offset``."""

    start: float
    steps: int
    batch: int
    context: int
    chunk: int
    offset: int


@dataclass(frozen=True, slots=True)
class StepResult:
    start: float
    end: float
    outputs: list[RequestOutput] = field(default_factory=list)
    num_scheduled_tokens: int = 0
    num_prefill_tokens: int = 0
    decode_batch_size: int = 0
    num_running: int = 0

    @property
    def duration(self) -> float:
        return self.end - self.start


class EngineCore:
    def __init__(self, config: EngineConfig, *, rank: int = 0, events: KVEventSink | None = None) -> None:
        self.config = config
        self.rank = rank
        self.stats = EngineStats()
        self.kv = KVCacheManager(config.num_blocks, config.block_size, events)
        self.scheduler = EngineScheduler(
            self.kv,
            self.stats,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
        )
        self.cost = StepCostModel(config.prefill_cost_model, config.decode_throughput_model)
        self.slow_factor = config.slow_factor
        self._requests: dict[str, Request] = {}
        self._free_at = 0.0
        self._num_added = 0

    # ---- requests -------------------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: Sequence[int] | PromptBlocks,
        params: SamplingParams,
        now: float,
        *,
        cache_salt: str | None = None,
    ) -> None:
        """Queue a request; ``prompt`` is token ids or, from a simulator, ``PromptBlocks``."""
        cfg = self.config
        if request_id in self._requests:
            raise RequestRejected(f"request id {request_id!r} is already in the engine")
        num_prompt = prompt.num_tokens if isinstance(prompt, PromptBlocks) else len(prompt)
        if num_prompt < 1:
            raise RequestRejected("The decoder prompt cannot be empty")
        if isinstance(prompt, PromptBlocks) and (
            len(prompt.block_hashes) != num_prompt // cfg.block_size or cache_salt is not None
        ):
            raise RequestRejected(
                f"{len(prompt.block_hashes)} block hashes for {num_prompt} tokens in blocks of "
                f"{cfg.block_size} (and no cache salt)"
            )
        if num_prompt + params.max_tokens > cfg.max_model_len:
            raise RequestRejected(
                f"prompt ({num_prompt}) + max_tokens ({params.max_tokens}) exceeds "
                f"max_model_len ({cfg.max_model_len})"
            )
        if params.max_tokens < 1:
            raise RequestRejected("max_tokens must be at least 1")
        self._num_added += 1
        seed = params.seed if params.seed is not None else hash((cfg.seed, self.rank, self._num_added))
        request = Request(
            request_id,
            prompt,
            params,
            arrival_time=now,
            block_size=cfg.block_size,
            token_seed=seed & 0xFFFFFFFFFFFF,
            vocab_size=cfg.vocab_size,
            cache_salt=cache_salt,
        )
        self._requests[request_id] = request
        self.scheduler.add(request)

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is and free its blocks; False if it is not (or no longer) here."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return False
        self.scheduler.remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = FinishReason.ABORT
        self.stats.request_success["abort"] += 1
        return True

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``reset_prefix_cache``: forget every cached prefix; False (nothing changes) while busy."""
        return self.kv.pool.reset_prefix_cache()

    def hold_until(self, t: float) -> None:
        """No step starts before ``t`` (a stalled Rank resumes in the present, not in its past)."""
        self._free_at = max(self._free_at, t)

    # ---- stepping -------------------------------------------------------------------------------------

    def has_work(self) -> bool:
        return bool(self._requests)

    def next_event_time(self) -> float | None:
        sched = self.scheduler
        if sched.running:
            return self._free_at
        if sched.waiting:
            return max(self._free_at, min(r.arrival_time for r in sched.waiting))
        return None

    def step(self, now: float) -> StepResult:
        """Run one step starting at ``now`` (no earlier than the previous step's end)."""
        now = max(now, self._free_at)
        sched = self.scheduler
        chunks = sched.schedule(now)
        if not chunks:
            return StepResult(now, now, num_running=len(sched.running))
        cost = self.cost
        eos_p = self.config.eos_probability
        batch = context = prefill_tokens = total = 0
        prefill_seconds = 0.0
        sampled: list[Request] = []
        for chunk in chunks:
            request = chunk.request
            n = chunk.num_tokens
            total += n
            start = chunk.start
            if start < request.prefill_end:
                base = request.prefill_base
                prefill_seconds += cost.prefill_chunk_seconds(start - base, start + n - base)
                prefill_tokens += n
            else:
                batch += 1
                context += start + 1
            if request.num_computed_tokens == request.num_tokens:
                sampled.append(request)
        duration = (cost.decode_seconds(batch, context) + prefill_seconds) * self.slow_factor
        end = now + duration
        self._free_at = end
        stats = self.stats
        stats.num_steps += 1
        stats.busy_seconds += duration
        outputs: list[RequestOutput] = []
        requests = self._requests
        for request in sampled:
            if request.count_unread_token(eos_p):
                continue  # a block-mode request's token in between: counted, never drawn, not reported
            token = request.append_output_token(eos_p)
            first = request.first_token_time is None
            if first:
                request.first_token_time = end
                stats.ttft.observe(end - request.arrival_time)
                stats.prompt_tokens += request.num_prompt_tokens
                stats.prompt_tokens_cached += request.num_cached_tokens
            reason = request.finished_by_token(token)
            if reason is not None:
                request.finish_reason = reason
                request.status = RequestStatus.FINISHED
                sched.finish(request)
                del requests[request.request_id]
                stats.request_success[reason.value] += 1
                stats.e2e.observe(end - request.arrival_time)
            elif not first and not request.tokens_kept:
                continue  # a block-mode request's token in between (after an EOS roll): nobody reads it
            outputs.append(
                RequestOutput(
                    request.request_id,
                    (token,),
                    reason,
                    request.num_prompt_tokens,
                    request.num_cached_tokens,
                    request.num_tokens - request.num_prompt_tokens,
                    first,
                )
            )
        stats.generation_tokens += len(sampled)
        return StepResult(
            now,
            end,
            outputs,
            num_scheduled_tokens=total,
            num_prefill_tokens=prefill_tokens,
            decode_batch_size=batch,
            num_running=len(sched.running),
        )

    # ---- plain runs (the simulator's fast path) ---------------------------------------------------------

    def plain_run(self, now: float) -> PlainRun | None:
        """The plain steps from ``now`` on (see ``EngineScheduler.plain_run``), at least two, as one plan;
        nothing changes until ``finish_plain_run``. None: step normally."""
        now = max(now, self._free_at)
        sched = self.scheduler
        steps, chunk = sched.plain_run(now, self.config.eos_probability)
        if steps < 2:
            return None
        running = sched.running
        decoders = running[:-1] if chunk else running
        context = sum(r.num_computed_tokens + 1 for r in decoders)
        last = running[-1]
        offset = last.num_computed_tokens - last.prefill_base
        return PlainRun(now, steps, len(decoders), context, chunk, offset)

    def plain_run_steps(self, run: PlainRun, before: float = math.inf) -> tuple[int, float]:
        """How many of the run's steps start before ``before`` (at least the first), and when they end.

        Step i decodes every decoding request at context ``context + i * batch`` and computes the prefill's
        chunk ``[offset + i * chunk, offset + (i + 1) * chunk)``, so the times are exactly those of stepping
        one by one (the same float sums, in the same order).
        """
        cost, slow = self.cost, self.slow_factor
        end = run.start
        steps = 0
        while steps < run.steps and (steps == 0 or end < before):
            prefill = 0.0
            if run.chunk:
                start = run.offset + steps * run.chunk
                prefill += cost.prefill_chunk_seconds(start, start + run.chunk)
            end += (cost.decode_seconds(run.batch, run.context + steps * run.batch) + prefill) * slow
            steps += 1
        return steps, end

    def plain_run_usage(self, run: PlainRun, before: float) -> float:
        """``kv_cache_usage`` once the run's steps that start before ``before`` are applied (what
        ``finish_plain_run(run, before)`` would leave), without applying them: the run goes on."""
        steps, _ = self.plain_run_steps(run, before)
        return self.kv.pool.usage(taken=self.scheduler.new_blocks(steps, run.chunk))

    def finish_plain_run(self, run: PlainRun, before: float = math.inf) -> float:
        """Apply the run's steps that start before ``before``; return when the last of them ends."""
        steps, end = self.plain_run_steps(run, before)
        self.scheduler.advance_plain(steps, run.chunk)
        stats = self.stats
        stats.num_steps += steps
        stats.busy_seconds += end - run.start
        stats.generation_tokens += steps * run.batch
        self._free_at = end
        return end

    # ---- observation ----------------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def kv_cache_usage(self) -> float:
        return self.kv.pool.usage()

    def get_request(self, request_id: str) -> Request | None:
        return self._requests.get(request_id)

    def load_score(self) -> int:
        """vLLM's DP load-balancing score: waiting weighs four times running."""
        return 4 * len(self.scheduler.waiting) + len(self.scheduler.running)
