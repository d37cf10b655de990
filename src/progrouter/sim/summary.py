"""What the Program scheduler said during a simulated arm, condensed for tuning.

The ``RecordingObserver`` keeps every transition, histogram observation and event; this module turns them
into the figures the spec's tuning section asks about (which TTLs were armed and from which source, how long
requests were retained, which transitions fired, what admission saw) plus the scheduler's own end state
from its diagnostics snapshot (rolling windows, fitted TTL, ledger). Transitions also become Prometheus-shaped
samples, so ``workload.report`` counts them exactly as it does for a live router.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from progrouter.program import RecordingObserver
from progrouter.workload.report import TRANSITIONS, Sample, percentiles

if TYPE_CHECKING:
    from progrouter.sim.routers import ProgramRouter


def transition_samples(observer: RecordingObserver) -> list[Sample]:
    """``transitions_total{target, reason}`` as the live router's exposition would carry it."""
    counts = Counter(observer.transitions)
    return [
        Sample(TRANSITIONS, (("reason", reason), ("target", target)), float(n))
        for (target, reason), n in sorted(counts.items())
    ]


def _stats(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    return {
        "count": len(values),
        "mean": float(np.mean(values)),
        **percentiles(values, (50, 90, 99)),
        "max": float(max(values)),
    }


def _armed_ttl(observations: Sequence[tuple[float, Mapping[str, str]]]) -> dict[str, Any]:
    def block(values: list[float]) -> dict[str, Any]:
        if not values:
            return {"count": 0}
        return {
            "count": len(values),
            "zero_share": sum(v <= 0.0 for v in values) / len(values),
            "mean": float(np.mean(values)),
        }

    by_source: dict[str, list[float]] = defaultdict(list)
    for value, labels in observations:
        by_source[labels.get("source", "")].append(value)
    return {
        **block([v for v, _ in observations]),
        "by_source": {s: block(v) for s, v in sorted(by_source.items())},
    }


def scheduler_summary(router: ProgramRouter, diagnostics: Mapping[str, Any]) -> dict[str, Any]:
    observer = router.observer
    histograms: dict[str, list[tuple[float, Mapping[str, str]]]] = defaultdict(list)
    for name, value, labels in observer.histograms:
        histograms[name].append((value, labels))

    def values(name: str) -> list[float]:
        return [v for v, _ in histograms.get(name, [])]

    ranks = diagnostics["ranks"]
    ledger, active = router.holdings()
    return {
        "transitions": dict(sorted(Counter(reason for _, reason in observer.transitions).items())),
        "armed_ttl_seconds": _armed_ttl(histograms.get("armed_ttl_seconds", [])),
        "queue_wait_seconds": _stats(values("queue_wait_seconds")),
        "request_interval_seconds": _stats(values("request_interval_seconds")),
        "cache_miss_impact_seconds": _stats(values("cache_miss_impact_seconds")),
        "admission": {
            "committed": len(values("admission_required_tokens")),
            "capacity_pressure_ratio": _stats(values("admission_capacity_pressure_ratio")),
            "projected_pressure_ratio": _stats(values("admission_projected_pressure_ratio")),
            "backend_kv_usage_ratio": _stats(values("admission_backend_kv_usage_ratio")),
        },
        "events": dict(sorted(Counter(name for _, name, _ in observer.events).items())),
        "end": {
            "settled_at": router.settled_at,
            "ledger_tokens": ledger,
            "active_programs": active,
            "retained_requests": diagnostics["retained_requests"],
            "programs": diagnostics["programs"],
            "ranks": [
                {
                    "target": r["target_id"],
                    "capacity_accounting_source": r["capacity_accounting_source"],
                    **{
                        k: r["rolling"].get(k)
                        for k in (
                            "request_samples",
                            "continuity_samples",
                            "request_window_complete",
                            "continuity_window_complete",
                            "fitted_acting_ttl_seconds",
                            "avg_cache_miss_impact_seconds",
                            "avg_cached_prompt_ratio",
                        )
                    },
                }
                for r in ranks
            ],
        },
    }
