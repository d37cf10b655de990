"""vLLM's ``/metrics`` text → per-Rank ``BackendObservation`` (upstream ``observations.rs``, spec §4.2).

Only three gauges matter to Program scheduling: ``vllm:kv_cache_usage_perc`` (fraction 0..1),
``vllm:num_requests_running`` and ``vllm:num_requests_waiting``. Each series carries an ``engine`` label,
the internal data-parallel Rank (0 when absent), and a target's ``dp_rank`` selects its engine. An engine
that lacks any of the three (or reports a non-finite value) yields no observation: nothing is fabricated, and
the scheduler falls back to its own ledger.

Parsing uses ``prometheus_client``'s parser on the lines of these families only, so a large exposition (vLLM
exports many histograms) costs a line scan, not a full parse.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from prometheus_client.parser import text_string_to_metric_families

from progrouter.program.types import BackendObservation
from progrouter.routing.target import Target

KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
FAMILIES = (KV_CACHE_USAGE, RUNNING, WAITING)

_PREFIXES = tuple(
    p for name in FAMILIES for p in (f"{name}{{", f"{name} ", f"# TYPE {name} ", f"# HELP {name} ")
)


def _engine(labels: Mapping[str, str]) -> int:
    value = labels.get("engine", "0")
    return int(value) if value.isdigit() else 0


def parse_vllm_metrics(text: str) -> dict[int, BackendObservation]:
    """Observations keyed by engine index; raises ``ValueError`` on a malformed exposition."""
    relevant = "\n".join(line for line in text.splitlines() if line.lstrip().startswith(_PREFIXES))
    values: dict[int, dict[str, float]] = {}
    for family in text_string_to_metric_families(relevant + "\n"):
        for sample in family.samples:
            if sample.name in FAMILIES and math.isfinite(sample.value):
                values.setdefault(_engine(sample.labels), {})[sample.name] = float(sample.value)
    out: dict[int, BackendObservation] = {}
    for engine, series in values.items():
        if all(name in series for name in FAMILIES):
            out[engine] = BackendObservation(
                kv_cache_usage=series[KV_CACHE_USAGE],
                running=int(series[RUNNING]),
                waiting=int(series[WAITING]),
            )
    return out


def observations_for_targets(
    targets: Sequence[Target], parsed: Mapping[int, BackendObservation]
) -> dict[str, BackendObservation]:
    """Map engine observations to the targets (Ranks) of one worker URL, keyed by target id."""
    return {t.id: parsed[t.rank] for t in targets if t.rank in parsed}
