"""Drive an EngineCore in modelled time until it is idle, collecting what each request produced."""

from __future__ import annotations

from dataclasses import dataclass, field

from progrouter.engine.config import EngineConfig
from progrouter.engine.core import EngineCore, RequestOutput, StepResult


@dataclass
class Trace:
    steps: list[StepResult] = field(default_factory=list)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    finished: dict[str, RequestOutput] = field(default_factory=dict)
    first_token_at: dict[str, float] = field(default_factory=dict)
    finished_at: dict[str, float] = field(default_factory=dict)


def run_until_idle(core: EngineCore, trace: Trace | None = None, max_steps: int = 1_000_000) -> Trace:
    trace = trace or Trace()
    for _ in range(max_steps):
        t = core.next_event_time()
        if t is None:
            return trace
        result = core.step(t)
        trace.steps.append(result)
        for out in result.outputs:
            trace.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.first_token:
                trace.first_token_at[out.request_id] = result.end
            if out.finished:
                trace.finished[out.request_id] = out
                trace.finished_at[out.request_id] = result.end
    raise AssertionError("engine did not go idle")


def small_config(**kw: object) -> EngineConfig:
    base: dict[str, object] = {"num_blocks": 64, "block_size": 16}
    base.update(kw)
    capacity = int(base["num_blocks"]) * int(base["block_size"])  # type: ignore[call-overload]
    base.setdefault("max_model_len", min(1024, capacity))
    return EngineConfig.model_validate(base)


def tokens(seed: int, n: int) -> list[int]:
    """n deterministic token ids, distinct per seed."""
    return [1000 + (seed * 7919 + i * 104729) % 20000 for i in range(n)]
