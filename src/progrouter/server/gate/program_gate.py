"""The asyncio shell around the sans-I/O ``ProgramScheduler``: what sits between an HTTP request and the core.

Per request, ``acquire`` extracts the Program identity (none, or a route that generates nothing → native
routing, and no Program state is ever created), estimates the prompt size, hands the request to the
scheduler and awaits its outcome: dispatched to a Rank (a ``ProgramTicket``) or timed out in the RequestPool
(``QueueTimeout``, 429). A client that goes away while its request is retained cancels it in the scheduler at
once.

Around that, three things keep the core fed, all with ``time.monotonic()``:
- a driver task that sleeps until the ``ProgramDriver`` (agents/driver.py) wants to be woken (the earlier of
  the next periodic tick, ``metrics_interval_seconds``, and the scheduler's ``next_deadline()``) and wakes it;
- the driver drains outcomes after every arrive/complete/cancel/observation (a completion often admits the
  next Program), so nothing waits for a tick that it does not need; each goes to the request's future;
- backend observation: ``/metrics`` polling starts only once Program traffic exists, and polls only the
  Ranks the scheduler tracks, bracketing each scrape with ``begin_observation``/``apply_observations``.

Model pools: a request naming a model joins ``program:model:<model>``, one without joins ``program:all``.
Every healthy Rank serves every pool: the router does not learn which worker serves which model (upstream
consults its worker registry's model labels). A client can name any ``model``, so pools are bounded: past
``max_model_pools`` a new name joins ``program:all`` (the worker still answers for that model, 404 if it has
none). This module makes no scheduling decision of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
from mypy_extensions import mypyc_attr
from prometheus_client import CollectorRegistry

from progrouter.agents.driver import ProgramDriver
from progrouter.agents.identity import extract_identity
from progrouter.agents.token_estimator import TokenEstimate, TokenEstimator, prompt_bytes
from progrouter.agents.usage import SseUsageAccumulator, merge_json_usage
from progrouter.config import AUTO_TOKEN_CAPACITY, ProgramSchedulingConfig, RouterConfig
from progrouter.observe.capacity_hint import CapacityHint
from progrouter.observe.poller import MetricsScraper, run_observation_loop
from progrouter.program import (
    DEFAULT_PROGRAM_PAGE,
    BackendObservation,
    Dispatched,
    Outcome,
    ProgramDispatch,
    ProgramRequest,
    ProgramScheduler,
    QueueTimeout,
    RequestHandle,
    ResidencyReport,
    ScheduleError,
    UsageObservation,
)
from progrouter.routing.kv_aware import KvAwarePolicy
from progrouter.routing.prefix_tree import CacheAwareIndex
from progrouter.routing.request_text import routing_text
from progrouter.routing.target import Target
from progrouter.server.dashboard.summary import Summary
from progrouter.server.gate.program_metrics import PrometheusObserver
from progrouter.server.gate.program_residency import ProgramResidency
from progrouter.server.telemetry.event_feed import EventFeed

log = logging.getLogger("progrouter.program.gate")

ALL_MODELS_POOL = "program:all"
# Routes that generate nothing and hold no KV: never a Program request (no admission, no charge, no Program),
# whatever identity they carry — a harness counts tokens with the session headers of the conversation it is
# sizing. The proxy and the EPP route them natively.
UNSCHEDULED_ROUTES = frozenset({"/v1/messages/count_tokens"})


def model_pool_of(body: Mapping[str, Any] | None) -> str:
    """``program:model:<model>`` when the body names a model, else ``program:all``."""
    model = body.get("model") if body is not None else None
    return f"program:model:{model}" if isinstance(model, str) and model else ALL_MODELS_POOL


@mypyc_attr(native_class=False)  # compiled, a subclass of a plain-Python exception stays plain
class Draining(ScheduleError):
    """The router is shutting down: a retryable 503 for a request still waiting in the RequestPool."""

    status = 503

    def __init__(self) -> None:
        super().__init__("the router is shutting down; retry the request")


class ProgramTicket:
    """One dispatched Program request: its Rank, the usage its response reports, and its single completion."""

    __slots__ = ("__weakref__", "_estimate", "_finished", "_gate", "_json", "_sse", "dispatch", "target")

    def __init__(self, gate: ProgramGate, dispatch: ProgramDispatch, estimate: TokenEstimate) -> None:
        self._gate = gate
        self.dispatch = dispatch
        self.target: Target = dispatch.target
        self._estimate = estimate
        self._json = UsageObservation()
        self._sse: SseUsageAccumulator | None = None
        self._finished = False

    @property
    def finished(self) -> bool:
        return self._finished

    def observe_json(self, body: bytes) -> None:
        """A complete (non-streamed) response body."""
        merge_json_usage(self._json, body)

    def observe_sse(self, chunk: bytes) -> None:
        """One streamed chunk, exactly as forwarded to the client."""
        if self._sse is None:
            self._sse = SseUsageAccumulator()
        self._sse.feed(chunk, time.monotonic())

    def observe_usage(self, usage: UsageObservation) -> None:
        """Usage known another way than from the response (the EPP's estimate when it sees no body)."""
        self._json.merge(usage)

    @property
    def stream_done(self) -> bool:
        """The streamed answer's ``data: [DONE]`` was forwarded: the worker's part is over."""
        return self._sse is not None and self._sse.done

    def finish(self, success: bool) -> None:
        """Complete the dispatch in the scheduler; only the first call counts."""
        if self._finished:
            return
        self._finished = True
        now = time.monotonic()
        usage = self._json
        decode_seconds = None
        if self._sse is not None:
            usage.merge(self._sse.finish())
            decode_seconds = self._sse.decode_seconds(now)
        self._gate._complete(now, self, success, usage, decode_seconds)

    def __del__(self) -> None:
        # Safety net for a caller that lost its ticket: complete it later on the loop, never from inside GC
        # (which may run in the middle of a scheduler call).
        if not self._finished:
            with contextlib.suppress(Exception):
                self._gate._loop_call_soon(self.finish, False)


def _hand(future: asyncio.Future[Outcome], outcome: Outcome) -> bool:
    """Resolve a waiting request's future; False when its client has gone (the future is done)."""
    if future.done():
        return False
    future.set_result(outcome)
    return True


class ProgramGate:
    """Program scheduling for one router: identity → scheduler → Rank, plus its driver and observation."""

    def __init__(
        self,
        config: RouterConfig,
        session: aiohttp.ClientSession,
        registry: CollectorRegistry,
        cache_index: CacheAwareIndex | None,
        kv_aware: KvAwarePolicy | None = None,  # its index and tokenizer serve residency_aware too
    ) -> None:
        program = config.program_scheduling
        if program is None:
            raise ValueError("ProgramGate needs RouterConfig.program_scheduling")
        self.config: ProgramSchedulingConfig = program
        self.observer = PrometheusObserver(registry)
        self.scheduler = ProgramScheduler(program, observer=self.observer, cache_index=cache_index)
        self.estimator = TokenEstimator(self.observer)
        hint = None
        if program.token_capacity_per_dp_rank is None and not program.binding_only:
            hint = CapacityHint(self.observer, program.max_active_programs_per_target)  # names vLLM's KV size
        self._scraper = MetricsScraper(
            session,
            api_key=config.api_key,
            capacity_hint=hint,
            kv_sizes=program.token_capacity_per_dp_rank == AUTO_TOKEN_CAPACITY,
        )
        self._keep_text, self._digest_body = self.scheduler.binding_reads
        self._targets: list[Target] = []
        self._pools: set[str] = set()
        self._wake: asyncio.Future[None] | None = None  # the driver's sleep; resolved to wake it early
        self._loop: asyncio.AbstractEventLoop | None = None
        self._driving: asyncio.Task[None] | None = None
        self._observation: asyncio.Task[None] | None = None
        self._wake_at = float("inf")  # when the sleeping driver wakes by itself
        self.residency = ProgramResidency.from_config(config, registry, kv_aware)
        interval = program.metrics_interval_seconds
        self.driver: ProgramDriver[asyncio.Future[Outcome]] = ProgramDriver(
            self.scheduler, interval, _hand, residency=self._residency, rearm=self._poke
        )

    # --------------------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._driving = asyncio.create_task(self._supervise("driver", self._drive), name="progrouter-program")

    async def stop(self) -> None:
        if self.residency is not None:
            await self.residency.stop()
        for task in (self._observation, self._driving):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._observation = self._driving = None
        for future in self.driver.waiters.values():
            future.cancel()
        self.driver.waiters.clear()

    def set_healthy_targets(self, targets: Sequence[Target]) -> None:
        """The healthy Ranks; each pool seen so far is served by all of them (a vanished Rank fails over)."""
        gone = {t.id for t in self._targets} - {t.id for t in targets}
        self._targets = list(targets)
        if self.residency is not None:
            self.residency.set_targets(self._targets)
        now = time.monotonic()
        for pool in sorted(self._pools):
            self.scheduler.set_ranks(pool, self._targets, now)
        for target_id in gone:
            self.observer.forget_target(target_id)
        self.driver.drain(now)

    # ----------------------------------------------------------------------------------------- requests
    async def acquire(
        self,
        *,
        route: str,
        body: Mapping[str, Any] | None,
        raw_body: bytes,
        headers: Mapping[str, str],
    ) -> ProgramTicket | None:
        """Wait until the request may go to its Rank; None when it carries no Program identity or its
        route is one of ``UNSCHEDULED_ROUTES`` (its identity is then not even read).

        Raises ``InvalidIdentity`` (400), ``NoTargets`` (503) or ``QueueTimeout`` (429).
        """
        if route in UNSCHEDULED_ROUTES:
            return None
        pool = model_pool_of(body)
        if pool not in self._pools and len(self._pools) >= self.config.max_model_pools:
            pool = ALL_MODELS_POOL
        found = extract_identity(
            body,
            headers,
            self.config.program_scheduling_enable_key,
            raw_body=raw_body,
            model_pool=pool,
            extensions=self.config.identity_extensions,
            digest_body=self._digest_body,
        )
        if found is None:
            return None
        residency = None
        if self.residency is not None:  # a long text prompt is tokenized in a worker thread meanwhile
            residency = await self.residency.arrival((pool, found.identity.program_id), body, raw_body)
        now = time.monotonic()
        if pool not in self._pools:
            self._pools.add(pool)
            self.scheduler.set_ranks(pool, self._targets, now)
        estimate = self.estimator.estimate(pool, route, prompt_bytes(body, raw_body))
        request = ProgramRequest(
            identity=found.identity,
            hints=found.hints,
            model_pool=pool,
            estimated_context_tokens=estimate.tokens,
            routing_text=routing_text(body) if self._keep_text else None,
            residency=residency,
        )
        future: asyncio.Future[Outcome] = self._running_loop().create_future()
        handle = self.driver.arrive(now, request, future)
        self._ensure_observation()
        try:
            outcome = await future
        except asyncio.CancelledError:
            self._abandon(handle, future)
            raise
        if isinstance(outcome, Dispatched):
            return ProgramTicket(self, outcome.dispatch, estimate)
        raise QueueTimeout()

    def rejected(self, error: ScheduleError) -> None:
        """The proxy answered ``error`` for a request: count it (``progrouter_program_rejections_total``)."""
        self.observer.rejected(error)

    def shed_waiting(self) -> int:
        """Drain: withdraw every request still waiting for a Rank and answer it ``Draining``; how many."""
        now = time.monotonic()
        shed = 0
        for handle, future in list(self.driver.waiters.items()):
            if future.done():
                continue
            self.driver.withdraw(now, handle)
            future.set_exception(Draining())
            shed += 1
        self.driver.drain(now)
        return shed

    def diagnostics(self, *, offset: int = 0, limit: int = DEFAULT_PROGRAM_PAGE) -> dict[str, Any]:
        """The scheduler's snapshot (one page of Programs) plus the token estimator's coefficients."""
        snapshot = self.scheduler.diagnostics(time.monotonic(), offset=offset, limit=limit)
        snapshot["token_estimation"] = self.estimator.diagnostics()
        return snapshot

    def summary(self) -> Summary:
        """Rank aggregates and pages of Programs for the dashboard (bounded, unlike ``diagnostics``)."""
        return Summary(self.scheduler, time.monotonic())

    @property
    def feed(self) -> EventFeed:
        return self.observer.feed

    # ------------------------------------------------------------------------------------------ internals
    def _abandon(self, handle: RequestHandle, future: asyncio.Future[Outcome]) -> None:
        """The client left while waiting: withdraw the request, or undo a dispatch it will never use."""
        now = time.monotonic()
        if future.done() and not future.cancelled():
            self.driver.waiters.pop(handle, None)
            outcome = future.result()
            if isinstance(outcome, Dispatched):
                self.scheduler.complete(now, outcome.dispatch, success=False, usage=None)
        else:
            self.driver.withdraw(now, handle)
        self.driver.drain(now)

    def _complete(
        self,
        now: float,
        ticket: ProgramTicket,
        success: bool,
        usage: UsageObservation,
        decode_seconds: float | None,
    ) -> None:
        if success:
            self.estimator.observe(ticket._estimate, usage.prompt_tokens)
        self.driver.complete(
            now,
            ticket.dispatch,
            success=success,
            usage=None if usage.empty else usage,
            decode_seconds=decode_seconds,
        )

    def _residency(self) -> dict[tuple[str, str], ResidencyReport] | None:
        return None if self.residency is None else self.residency.report(self._targets)

    def _poke(self) -> None:
        """Wake the driver when the scheduler's next deadline now comes before the driver's wake-up.

        A deadline that moved later needs no wake-up: the driver wakes at its old time and recomputes.
        (Waking it on every arrival and completion cost a task step, a future and a timer each.)
        """
        wake = self._wake
        if wake is None or wake.done():
            return
        if self.driver.deadline_before(self._wake_at) is not None:
            wake.set_result(None)

    async def _sleep(self, delay: float) -> None:
        """Sleep up to ``delay`` seconds or until poked. (A plain future, not ``wait_for``: on Python 3.11
        ``wait_for`` can swallow a cancellation that races with the event, which would hang ``stop``.)"""
        loop = asyncio.get_running_loop()
        wake: asyncio.Future[None] = loop.create_future()
        self._wake = wake
        timer = loop.call_later(delay, lambda: None if wake.done() else wake.set_result(None))
        try:
            await wake
        finally:
            timer.cancel()
            self._wake = None

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The loop taken at ``start``: ``asyncio.get_running_loop`` is a getpid system call on CPython 3.11,
        once per request here otherwise."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _loop_call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(callback, *args)

    async def _drive(self) -> None:
        driver = self.driver
        driver.start(time.monotonic())
        while True:
            wake_at = driver.wake_at()
            delay = wake_at - time.monotonic()
            if delay > 0:
                self._wake_at = wake_at
                await self._sleep(delay)
            now = time.monotonic()
            if now < wake_at:
                continue  # woken early by new work: recompute the deadline
            driver.wake(now)

    def _ensure_observation(self) -> None:
        if self._observation is None and self._driving is not None:

            def begin() -> object:
                return self.driver.begin_observation(time.monotonic())

            def apply(epoch: Any, observations: dict[str, BackendObservation]) -> None:
                self.driver.apply_observations(time.monotonic(), epoch, observations)

            self._observation = asyncio.create_task(
                self._supervise(
                    "backend observation",
                    lambda: run_observation_loop(
                        self._scraper,
                        self.config.metrics_interval_seconds,
                        self.scheduler.tracked_ranks,
                        begin,
                        apply,
                    ),
                ),
                name="progrouter-observation",
            )

    async def _supervise(self, what: str, run: Callable[[], Awaitable[None]]) -> None:
        """Keep a background loop alive: a bug in one pass is logged, not fatal to scheduling."""
        while True:
            try:
                await run()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("Program scheduling %s loop failed; restarting", what)
                await asyncio.sleep(self.config.metrics_interval_seconds)
