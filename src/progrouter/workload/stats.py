"""Does this workload have reuse opportunities? (the spec's check before tuning Program scheduling)

For each Program, every completion-to-next-request interval is compared with the calibrated cache-miss
impact of the context that would have to be recomputed if the KV were evicted during the interval
(``PrefillCostModel.cache_miss_impact_seconds`` of the previous request's prompt plus output). Progress-TTL
pays off when many intervals are shorter than that impact; a workload whose intervals are mostly longer is a
non-regression case.

Works on a trace (intervals are the planned gaps) and on replay facts (intervals are measured, converted to
modelled seconds). A blocking parent's planned gap does not include its subagents' run time; the measured
interval does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from progrouter.config import PrefillCostModel
from progrouter.workload.facts import Fact
from progrouter.workload.trace import Trace

CONTEXT_BUCKETS = (0, 8_192, 32_768, 131_072)


@dataclass(frozen=True, slots=True)
class Interval:
    program_id: str
    seconds: float
    context_tokens: int
    impact_seconds: float

    @property
    def reusable(self) -> bool:
        return self.seconds < self.impact_seconds


def trace_intervals(trace: Trace, model: PrefillCostModel) -> list[Interval]:
    out = []
    for _task, p in trace.programs():
        for prev, cur in itertools.pairwise(p.requests):
            ctx = prev.input_tokens + prev.output_tokens
            out.append(Interval(p.program_id, cur.gap, ctx, model.cache_miss_impact_seconds(ctx)))
    return out


def fact_intervals(facts: Iterable[Fact], model: PrefillCostModel) -> list[Interval]:
    by_program: dict[str, list[Fact]] = {}
    for f in facts:
        if f.ok:
            by_program.setdefault(f.program_id, []).append(f)
    out = []
    for pid, fs in by_program.items():
        fs.sort(key=lambda f: f.step_id)
        for prev, cur in itertools.pairwise(fs):
            if cur.step_id != prev.step_id + 1:
                continue
            ctx = (prev.prompt_tokens or prev.input_tokens) + (
                prev.output_tokens or prev.planned_output_tokens
            )
            seconds = max(0.0, cur.started_at - prev.finished_at) * cur.time_scale
            out.append(Interval(pid, seconds, ctx, model.cache_miss_impact_seconds(ctx)))
    return out


def trace_shape(trace: Trace) -> dict[str, Any]:
    """The workload's shape as quantiles: input tokens per request, context growth per turn (compactions
    excluded), output tokens, turns per session (the lead's requests), think/tool gaps (every request after a
    Program's first) and the share of sessions that start subagents."""
    inputs: list[int] = []
    growth: list[int] = []
    outputs: list[int] = []
    gaps: list[float] = []
    for _task, p in trace.programs():
        inputs.extend(r.input_tokens for r in p.requests)
        outputs.extend(r.output_tokens for r in p.requests)
        for prev, cur in itertools.pairwise(p.requests):
            gaps.append(cur.gap)
            if cur.input_tokens >= prev.input_tokens:
                growth.append(cur.input_tokens - prev.input_tokens)
    turns = [len(t.lead.requests) for t in trace.tasks]

    def q(values: Sequence[float], ps: Sequence[int]) -> dict[str, float | None]:
        return {f"p{p}": (float(np.percentile(values, p)) if len(values) else None) for p in ps}

    return {
        "requests": len(inputs),
        "sessions": len(trace.tasks),
        "input_tokens": q(inputs, (10, 50, 90)),
        "growth_tokens": q(growth, (50, 90)),
        "output_tokens": q(outputs, (50, 90)),
        "turns_per_session": q(turns, (50, 90)),
        "gap_seconds": q(gaps, (10, 25, 50, 75, 90, 99)),
        "gap_share_within_1s": _share([g <= 1.0 for g in gaps]),
        "gap_share_within_10s": _share([g <= 10.0 for g in gaps]),
        "subagent_session_share": _share([len(t.programs) > 1 for t in trace.tasks]),
    }


def _share(xs: Sequence[bool]) -> float | None:
    return None if not xs else sum(xs) / len(xs)


def summarize(intervals: Sequence[Interval]) -> dict[str, Any]:
    """Figures of the reuse check; shares are fractions in [0, 1], None when there is nothing to count."""
    secs = np.array([i.seconds for i in intervals], dtype=float)
    impacts = np.array([i.impact_seconds for i in intervals], dtype=float)
    by_bucket = []
    edges = [*CONTEXT_BUCKETS, None]
    for lo, hi in itertools.pairwise(edges):
        assert lo is not None
        sel = [i for i in intervals if i.context_tokens >= lo and (hi is None or i.context_tokens < hi)]
        if sel:
            by_bucket.append(
                {
                    "context_tokens": f"{lo}-{hi}" if hi is not None else f"{lo}+",
                    "intervals": len(sel),
                    "median_interval_seconds": float(np.median([i.seconds for i in sel])),
                    "median_impact_seconds": float(np.median([i.impact_seconds for i in sel])),
                    "share_below_impact": _share([i.reusable for i in sel]),
                }
            )

    def q(a: np.ndarray, p: float) -> float | None:
        return float(np.percentile(a, p)) if a.size else None

    return {
        "programs": len({i.program_id for i in intervals}),
        "intervals": len(intervals),
        "share_below_impact": _share([i.reusable for i in intervals]),
        "share_within_1s": _share([i.seconds <= 1.0 for i in intervals]),
        "share_within_10s": _share([i.seconds <= 10.0 for i in intervals]),
        "interval_seconds": {"p50": q(secs, 50), "p90": q(secs, 90), "p99": q(secs, 99)},
        "impact_seconds": {"p50": q(impacts, 50), "p90": q(impacts, 90)},
        "by_context": by_bucket,
        "verdict": verdict(_share([i.reusable for i in intervals])),
    }


def verdict(share_below_impact: float | None) -> str:
    if share_below_impact is None:
        return "no intervals: every Program makes a single request"
    if share_below_impact >= 0.5:
        return "reuse opportunities: most Programs return before recomputing their context would be cheaper"
    if share_below_impact >= 0.1:
        return "some reuse opportunities"
    return "long-tool-call workload: expect short or zero TTLs (a non-regression case)"
