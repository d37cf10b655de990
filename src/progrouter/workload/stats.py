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
