"""A fake-clock driver for ``ProgramScheduler`` tests: what a shell does, minus the network."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

from progrouter.config import ProgramSchedulingConfig
from progrouter.program.core.request_pool import RequestHandle
from progrouter.program.core.scheduler import ProgramScheduler
from progrouter.program.core.state import ProgramRef
from progrouter.program.observer import RecordingObserver
from progrouter.program.outcomes import Dispatched, ProgramDispatch, ProgramRequest, TimedOut
from progrouter.program.types import BackendObservation, ProgramIdentity, RequestHints, UsageObservation
from progrouter.routing.target import Target

POOL = "program:model:m"
T0 = "http://w:1@0"
T1 = "http://w:1@1"


def identity(program_id: str, **fields: Any) -> ProgramIdentity:
    return ProgramIdentity(
        program_id=program_id,
        placement_key=fields.pop("placement_key", program_id),
        placement_hash_key=fields.pop("placement_hash_key", f"header:x-session-id:{program_id}"),
        **fields,
    )


class Harness:
    """Drives one scheduler with an explicit clock and keeps what it decided."""

    def __init__(self, targets: Iterable[str] = (T0,), **config: Any) -> None:
        self.config = ProgramSchedulingConfig(**config)
        self.observer = RecordingObserver()
        self.scheduler = ProgramScheduler(self.config, observer=self.observer)
        self.now = 0.0
        self.set_ranks(targets)
        self.dispatches: dict[int, ProgramDispatch] = {}
        self.dispatch_order: list[str] = []
        self.timed_out: list[RequestHandle] = []

    # ------------------------------------------------------------------ events
    def at(self, now: float) -> Harness:
        assert now >= self.now, "the fake clock only moves forward"
        self.now = now
        return self

    def set_ranks(self, targets: Iterable[str], pool: str = POOL) -> None:
        self.scheduler.set_ranks(pool, [Target.parse(t) for t in targets], self.now)
        self.drain()

    def arrive(
        self,
        program_id: str,
        context: int = 100,
        *,
        pool: str = POOL,
        text: str | None = None,
        step_id: int | None = None,
        **hints: Any,
    ) -> RequestHandle:
        request = ProgramRequest(
            identity(program_id, step_id=step_id), RequestHints(**hints), pool, context, routing_text=text
        )
        handle = self.scheduler.arrive(self.now, request)
        self.drain()
        return handle

    def complete(
        self,
        handle: RequestHandle,
        *,
        prompt: int | None = None,
        completion: int | None = 10,
        cached: int | None = None,
        success: bool = True,
        terminate: bool = False,
        decode_seconds: float | None = None,
    ) -> None:
        dispatch = self.dispatches[handle.id]
        usage = UsageObservation(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)
        self.scheduler.complete(
            self.now,
            dispatch,
            success=success,
            usage=usage,
            decode_seconds=decode_seconds,
            terminate=terminate,
        )
        self.drain()

    def cancel(self, handle: RequestHandle) -> None:
        self.scheduler.cancel(self.now, handle)
        self.drain()

    def tick(self, now: float | None = None) -> None:
        if now is not None:
            self.at(now)
        self.scheduler.tick(self.now)
        self.drain()

    def observe(self, observations: dict[str, BackendObservation], *, begin_at: float | None = None) -> None:
        epoch = self.scheduler.begin_observation(self.now if begin_at is None else begin_at)
        self.scheduler.apply_observations(self.now, epoch, observations)
        self.drain()

    def drain(self) -> None:
        for outcome in self.scheduler.take_outcomes():
            if isinstance(outcome, Dispatched):
                assert outcome.handle.id not in self.dispatches, "dispatched twice"
                self.dispatches[outcome.handle.id] = outcome.dispatch
                self.dispatch_order.append(outcome.handle.program_id)
            else:
                assert isinstance(outcome, TimedOut)
                self.timed_out.append(outcome.handle)

    # ------------------------------------------------------------------ views
    def dispatched(self, handle: RequestHandle) -> bool:
        return handle.id in self.dispatches

    def target_of(self, handle: RequestHandle) -> str:
        return self.dispatches[handle.id].target.id

    def diagnostics(self) -> dict[str, Any]:
        return self.scheduler.diagnostics(self.now)

    def rank(self, rank_id: str = T0) -> dict[str, Any]:
        for rank in self.diagnostics()["ranks"]:
            if rank["target_id"] == rank_id:
                return rank  # type: ignore[no-any-return]
        raise KeyError(rank_id)

    def program(self, program_id: str, generation: int = 0, pool: str = POOL) -> dict[str, Any] | None:
        redacted = ProgramRef(pool, program_id, generation).redacted_id()
        for rank in self.diagnostics()["ranks"]:
            for program in rank["programs"]:
                if program["program"] == redacted:
                    return program  # type: ignore[no-any-return]
        return None

    def transitions(self, reason: str) -> list[str]:
        return [target for target, r in self.observer.transitions if r == reason]

    def events(self, name: str) -> list[dict[str, Any]]:
        return self.observer.events_named(name)

    def histogram_values(self, name: str, **labels: str) -> list[float]:
        return [
            value
            for n, value, got in self.observer.histograms
            if n == name and all(got.get(k) == v for k, v in labels.items())
        ]


@pytest.fixture
def harness() -> Callable[..., Harness]:
    return Harness
