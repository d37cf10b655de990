"""The benchmark's arithmetic: pure functions from replay facts and metric scrapes to per-arm figures.

All durations are reported in modelled seconds (wall seconds times the facts' ``time_scale``). Token cache hit
is the spec's ratio of backend counters, Δ``vllm:prompt_tokens_cached_total`` / Δ``vllm:prompt_tokens_total``,
summed over every Rank of every engine. Router queue wait comes from the router's
``vllm_router_agent_aware_queue_wait_seconds`` histogram when it has samples, else from the replay (time from
sending a request to its response headers, an upper bound that includes the backend's own queueing); the
figure says which.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from progrouter.config import PrefillCostModel
from progrouter.workload.facts import Fact

PROMPT_TOKENS = "vllm:prompt_tokens_total"
CACHED_TOKENS = "vllm:prompt_tokens_cached_total"
REQUEST_SUCCESS = "vllm:request_success_total"
PREEMPTIONS = "vllm:num_preemptions_total"
QUEUE_WAIT = "vllm_router_agent_aware_queue_wait_seconds"
TRANSITIONS = "vllm_router_agent_aware_transitions_total"
#: Transition reasons shown in the report (the spec's fairness and migration events).
REPORTED_TRANSITIONS = (
    "cross_rank_resume",
    "force_resume",
    "max_segment_yield",
    "ttl_expired",
    "capacity_repair",
)


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


def parse_metrics(text: str, source: str = "") -> list[Sample]:
    """Every sample of a Prometheus exposition; ``source`` (e.g. the engine URL) is added as a label."""
    try:
        return _parse(text, source)
    except ValueError:
        # One malformed line makes the parser refuse the whole text: keep every line that parses alone.
        out = []
        for line in text.splitlines():
            if line.strip() and not line.startswith("#"):
                with contextlib.suppress(ValueError):
                    out.extend(_parse(line, source))
        return out


def _parse(text: str, source: str) -> list[Sample]:
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = dict(s.labels)
            if source:
                labels["source"] = source
            out.append(Sample(s.name, tuple(sorted(labels.items())), float(s.value)))
    return out


def _sum_by(samples: Iterable[Sample], name: str, keys: Sequence[str]) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = defaultdict(float)
    for s in samples:
        if s.name == name:
            out[tuple(s.label(k) or "" for k in keys)] += s.value
    return dict(out)


def counter_delta(
    before: Iterable[Sample], after: Iterable[Sample], name: str, keys: Sequence[str] = ()
) -> dict[tuple[str, ...], float]:
    """after − before of a counter, summed per ``keys`` (a counter that restarted counts from zero)."""
    b, a = _sum_by(before, name, keys), _sum_by(after, name, keys)
    return {k: (v - b.get(k, 0.0) if v >= b.get(k, 0.0) else v) for k, v in a.items()}


def _total(d: Mapping[tuple[str, ...], float]) -> float:
    return float(sum(d.values()))


def percentiles(values: Sequence[float], ps: Sequence[int] = (50, 90, 99)) -> dict[str, float | None]:
    if not values:
        return {f"p{p}": None for p in ps}
    arr = np.asarray(values, dtype=float)
    return {f"p{p}": float(np.percentile(arr, p)) for p in ps}


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def task_jct(facts: Sequence[Fact], planned_requests: Mapping[str, int]) -> dict[str, float]:
    """Job completion time (modelled seconds) of each task whose every planned request finished ok."""
    ok: dict[str, int] = defaultdict(int)
    end: dict[str, float] = {}
    start: dict[str, float] = {}
    scale: dict[str, float] = {}
    for f in facts:
        if not f.ok:
            continue
        ok[f.task_id] += 1
        end[f.task_id] = max(end.get(f.task_id, -math.inf), f.finished_at)
        start[f.task_id] = f.task_start
        scale[f.task_id] = f.time_scale
    return {
        t: (end[t] - start[t]) * scale[t] for t, n in planned_requests.items() if n > 0 and ok.get(t, 0) == n
    }


def histogram_quantiles(samples: Sequence[Sample], name: str, qs: Sequence[float]) -> dict[str, Any]:
    """count, mean and quantiles of a Prometheus histogram summed over its labels (linear within buckets).

    A summary (what upstream's Rust exporter emits) has no buckets: its per-series quantiles are averaged,
    weighted by each series' count — an approximation, since quantiles do not add up.
    """
    buckets: dict[float, float] = defaultdict(float)
    count = total = 0.0
    for s in samples:
        if s.name == f"{name}_bucket":
            le = s.label("le") or "+Inf"
            buckets[math.inf if le in ("+Inf", "inf") else float(le)] += s.value
        elif s.name == f"{name}_count":
            count += s.value
        elif s.name == f"{name}_sum":
            total += s.value
    out: dict[str, Any] = {"count": count, "mean": total / count if count else None}
    if not buckets:
        out.update(_summary_quantiles(samples, name, qs))
        return out
    edges = sorted(buckets)
    for q in qs:
        key = f"p{round(q * 100)}"
        out[key] = None
        if not count:
            continue
        rank, lo, prev = q * count, 0.0, 0.0
        for edge in edges:
            c = buckets[edge]
            if c >= rank:
                if math.isinf(edge):
                    out[key] = lo
                else:
                    out[key] = lo + (edge - lo) * ((rank - prev) / (c - prev) if c > prev else 1.0)
                break
            lo, prev = (edge if not math.isinf(edge) else lo), c
    return out


def _summary_quantiles(samples: Sequence[Sample], name: str, qs: Sequence[float]) -> dict[str, float | None]:
    counts: dict[tuple[tuple[str, str], ...], float] = {}
    values: dict[tuple[tuple[str, str], ...], dict[str, float]] = defaultdict(dict)
    for s in samples:
        series = tuple((k, v) for k, v in s.labels if k != "quantile")
        if s.name == f"{name}_count":
            counts[series] = s.value
        elif s.name == name and s.label("quantile") is not None:
            values[series][str(s.label("quantile"))] = s.value
    out: dict[str, float | None] = {}
    for q in qs:
        weighted = [(counts.get(k, 0.0), v[str(q)]) for k, v in values.items() if str(q) in v]
        weight = sum(c for c, _ in weighted)
        out[f"p{round(q * 100)}"] = sum(c * x for c, x in weighted) / weight if weight else None
    return out


@dataclass(frozen=True, slots=True)
class ArmInputs:
    """What one arm produced: its facts, the engines' metrics before and after, the router's after."""

    facts: Sequence[Fact]
    planned_requests: Mapping[str, int]
    engine_before: Sequence[Sample]
    engine_after: Sequence[Sample]
    router_after: Sequence[Sample] = ()
    wall_seconds: float | None = None


def arm_figures(inp: ArmInputs) -> dict[str, Any]:
    """Every figure of one arm (modelled seconds), as a JSON-ready dict."""
    facts = list(inp.facts)
    ok = [f for f in facts if f.ok]
    scale = facts[0].time_scale if facts else 1.0
    jct = task_jct(facts, inp.planned_requests)
    jcts = list(jct.values())
    ttft = [f.ttft * f.time_scale for f in ok if f.ttft is not None]
    e2e = [f.latency * f.time_scale for f in ok]
    makespan = (max(f.finished_at for f in ok) - min(f.started_at for f in ok)) * scale if ok else 0.0
    out_tokens = sum(f.output_tokens or 0 for f in ok)
    in_tokens = sum(f.prompt_tokens or f.input_tokens for f in ok)
    prompt = _total(counter_delta(inp.engine_before, inp.engine_after, PROMPT_TOKENS))
    cached = _total(counter_delta(inp.engine_before, inp.engine_after, CACHED_TOKENS))
    usage_prompt = sum(f.prompt_tokens or 0 for f in ok)
    usage_cached = sum(f.cached_tokens or 0 for f in ok)
    ranks = per_rank(inp.engine_before, inp.engine_after)
    return {
        "tasks": len(inp.planned_requests),
        "completed_tasks": len(jct),
        "requests": len(facts),
        "ok_requests": len(ok),
        "errors": sum(f.status == "error" for f in facts),
        "jct_seconds": {"mean": _mean(jcts), **percentiles(jcts, (50, 90))},
        "ttft_seconds": percentiles(ttft, (50, 99)),
        "e2e_seconds": percentiles(e2e, (50, 99)),
        "makespan_seconds": makespan,
        "requests_per_second": len(ok) / makespan if makespan > 0 else None,
        "output_tokens_per_second": out_tokens / makespan if makespan > 0 else None,
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "token_cache_hit": cached / prompt if prompt > 0 else None,
        "engine_prompt_tokens": prompt,
        "engine_cached_tokens": cached,
        "usage_cache_hit": usage_cached / usage_prompt if usage_prompt > 0 else None,
        "preemptions": _total(counter_delta(inp.engine_before, inp.engine_after, PREEMPTIONS)),
        "queue_wait": queue_wait(ok, inp.router_after),
        "transitions": transitions(inp.router_after),
        "ranks": ranks,
        "wall_seconds": inp.wall_seconds,
    }


def per_rank(before: Sequence[Sample], after: Sequence[Sample]) -> list[dict[str, Any]]:
    """Requests and prompt tokens served by each Rank (engine URL × ``engine`` label)."""
    keys = ("source", "engine")
    reqs = counter_delta(before, after, REQUEST_SUCCESS, keys)
    prompt = counter_delta(before, after, PROMPT_TOKENS, keys)
    cached = counter_delta(before, after, CACHED_TOKENS, keys)
    out = []
    for key in sorted(set(reqs) | set(prompt), key=lambda k: (k[0], int(k[1]) if k[1].isdigit() else 0)):
        src, engine = key
        p = prompt.get(key, 0.0)
        out.append(
            {
                "rank": f"{src}@{engine}" if src else engine,
                "requests": reqs.get(key, 0.0),
                "prompt_tokens": p,
                "token_cache_hit": cached.get(key, 0.0) / p if p > 0 else None,
            }
        )
    return out


def queue_wait(ok: Sequence[Fact], router: Sequence[Sample]) -> dict[str, Any]:
    h = histogram_quantiles(router, QUEUE_WAIT, (0.5, 0.9, 0.99))
    if h["count"]:
        scale = ok[0].time_scale if ok else 1.0
        kind = "histogram" if any(s.name == f"{QUEUE_WAIT}_bucket" for s in router) else "summary"
        return {
            "source": f"router {kind}",
            "count": h["count"],
            **{k: (v * scale if v is not None else None) for k, v in h.items() if k != "count"},
        }
    waits = [(f.headers_at - f.started_at) * f.time_scale for f in ok if f.headers_at is not None]
    return {
        "source": "replay estimate (time to response headers)",
        "count": len(waits),
        "mean": _mean(waits),
        **percentiles(waits, (50, 90, 99)),
    }


def transitions(router: Sequence[Sample]) -> dict[str, float]:
    by_reason = _sum_by(router, TRANSITIONS, ("reason",))
    out = {r: 0.0 for r in REPORTED_TRANSITIONS}
    out.update({k[0]: v for k, v in by_reason.items()})
    return out


# --- comparisons across arms ---


#: A native→oracle JCT gap smaller than this share of native's JCT is noise, not a gap to close.
MIN_GAP_SHARE = 0.02
#: Figures compared as ratios to the baseline arm.
RATIO_FIGURES: tuple[str, ...] = (
    "jct_seconds.mean",
    "jct_seconds.p50",
    "jct_seconds.p90",
    "ttft_seconds.p50",
    "ttft_seconds.p99",
    "e2e_seconds.p50",
    "e2e_seconds.p99",
    "requests_per_second",
    "output_tokens_per_second",
    "token_cache_hit",
)


def figure(figures: Mapping[str, Any], path: str) -> float | None:
    cur: Any = figures
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return float(cur) if isinstance(cur, int | float) and not isinstance(cur, bool) else None


def prefill_gpu_seconds(facts: Iterable[Fact], model: PrefillCostModel) -> float:
    """Modelled prefill GPU-seconds the engines spent: ``model`` on each completed request's uncached prompt
    tokens (a cold-prefill model, so it undercounts a suffix appended to a long cached context)."""
    return sum(model.prefill_seconds((f.prompt_tokens or 0) - (f.cached_tokens or 0)) for f in facts if f.ok)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b != 0 else None


def compare(
    arms: Mapping[str, Mapping[str, Any]], baseline: str = "native", floor: str = "oracle"
) -> dict[str, Any]:
    """Each arm's figures as ratios to ``baseline``, and the share of the baseline→floor JCT gap it closes."""
    base = arms.get(baseline)
    out: dict[str, Any] = {}
    for name, figs in arms.items():
        ratios = {p: ratio(figure(figs, p), figure(base, p)) if base else None for p in RATIO_FIGURES}
        out[name] = {
            "ratios_to_" + baseline: ratios,
            "jct_gap_closed": gap_closed(arms, name, baseline, floor),
        }
    return out


def gap_closed(arms: Mapping[str, Mapping[str, Any]], arm: str, baseline: str, floor: str) -> float | None:
    """(baseline − arm) / (baseline − floor) of mean JCT: 0 = baseline, 1 = as good as the floor."""
    if baseline not in arms or floor not in arms or arm not in arms:
        return None
    b = figure(arms[baseline], "jct_seconds.mean")
    f = figure(arms[floor], "jct_seconds.mean")
    a = figure(arms[arm], "jct_seconds.mean")
    if a is None or b is None or f is None or b - f <= MIN_GAP_SHARE * b:
        return None  # no gap worth closing: the baseline is already at the floor
    return (b - a) / (b - f)
