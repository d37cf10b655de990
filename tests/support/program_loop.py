"""A seeded closed loop of Program requests through the sans-I/O scheduler, for comparing two builds of it.

``closed_loop`` takes the scheduler's modules as a ``ProgramModules`` (the compiled ones, or their
plain-Python copies from ``support.pure.plain_python``), so one loop serves both the equivalence tests of the
scheduler's shortcuts and the test that the compiled build decides what its source decides.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from progrouter.config import ProgramSchedulingConfig
from progrouter.routing.target import Target

POOL = "program:model:m"
Decision = tuple[str, int, str]


@dataclass(frozen=True)
class ProgramModules:
    """The scheduler's modules of one build."""

    admission: ModuleType
    outcomes: ModuleType
    queues: ModuleType
    records: ModuleType
    resume: ModuleType
    scheduler: ModuleType
    state: ModuleType
    types: ModuleType

    @classmethod
    def load(cls, load: Callable[[str], ModuleType]) -> ProgramModules:
        names = ("core.admission", "outcomes", "core.queues", "core.records", "core.resume", "core.scheduler")
        return cls(*(load(f"progrouter.program.{name}") for name in (*names, "core.state", "types")))


def closed_loop(m: ProgramModules, seed: int, *, steps: int = 2500, **fields: Any) -> list[Decision]:
    """300 Programs on two Ranks that fit about 25: long queues, matured windows, forced resumes, scrapes.
    Every decision in order (``fields``: scheduling config on top of the loop's)."""
    config = ProgramSchedulingConfig.model_validate(
        {
            "token_capacity_per_dp_rank": 100_000,
            "stats_window_size": 20,
            "force_resume_timeout_seconds": 2.0,
            "queue_timeout_seconds": 30.0,
            "max_pooled_requests": 1000,
            "global_queue": True,
            **fields,
        }
    )
    types, outcomes = m.types, m.outcomes
    scheduler = m.scheduler.ProgramScheduler(config)
    targets = [Target.parse("http://w:1@0"), Target.parse("http://w:1@1")]
    scheduler.set_ranks(POOL, targets, 0.0)
    rng = random.Random(seed)
    contexts = [rng.randint(1_000, 9_000) for _ in range(300)]
    decisions: list[Decision] = []
    in_flight: deque[Any] = deque()
    idle: deque[int] = deque(range(300))
    now = 0.0

    def collect() -> None:
        for outcome in scheduler.take_outcomes():
            if isinstance(outcome, outcomes.Dispatched):
                decisions.append(("dispatch", outcome.handle.id, outcome.dispatch.target.id))
                in_flight.append(outcome.dispatch)
            elif isinstance(outcome, outcomes.TimedOut):
                decisions.append(("timeout", outcome.handle.id, ""))
                idle.append(int(outcome.handle.program_id[1:]))

    for step in range(steps):
        now += rng.uniform(0.0, 0.05)
        if idle and (not in_flight or rng.random() < 0.7):
            i = idle.popleft()
            hints = types.RequestHints(
                priority=rng.choice([0, 0, 1]), kv_retention_ttl_seconds=rng.choice([None, 0.5])
            )
            identity = types.ProgramIdentity(f"p{i}", f"p{i}", f"p{i}")
            scheduler.arrive(now, outcomes.ProgramRequest(identity, hints, POOL, contexts[i]))
        elif in_flight:
            dispatch = in_flight.popleft()
            i = int(dispatch.program.program_id[1:])
            prompt = contexts[i]
            contexts[i] += rng.randint(50, 400)
            usage = types.UsageObservation(prompt, 100, int(prompt * rng.uniform(0.5, 1.0)))
            scheduler.complete(now, dispatch, success=True, usage=usage, decode_seconds=1.0)
            idle.append(i)
        if step % 50 == 0:
            epoch = scheduler.begin_observation(now)
            observed = {
                t.id: types.BackendObservation(rng.uniform(0.3, 0.9), rng.randint(5, 30), 0) for t in targets
            }
            scheduler.apply_observations(now, epoch, observed)
            scheduler.tick(now)
        collect()
    return decisions
