"""vLLM's ``/metrics`` text → per-Rank ``BackendObservation`` (upstream ``observations.rs``, spec §4.2).

Only three gauges matter to Program scheduling: ``vllm:kv_cache_usage_perc`` (fraction 0..1),
``vllm:num_requests_running`` and ``vllm:num_requests_waiting``. Each series carries an ``engine`` label,
the internal data-parallel Rank (0 when absent), and a target's ``dp_rank`` selects its engine. An engine
that lacks any of the three (or reports a non-finite value) yields no observation: nothing is fabricated, and
the scheduler falls back to its own ledger.

Parsing uses ``prometheus_client``'s parser on the lines of these families only, so a large exposition (vLLM
exports many histograms) costs a line scan, not a full parse.

``kv_capacities`` reads a fourth family, ``vllm:cache_config_info``: the KV size of a Rank (``progrouter
calibrate`` writes it into a config; the router names it when unset, and follows it under ``"auto"``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from prometheus_client.parser import text_string_to_metric_families

from progrouter.program import BackendObservation
from progrouter.routing.target import Target

KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
FAMILIES = (KV_CACHE_USAGE, RUNNING, WAITING)
CACHE_CONFIG_INFO = "vllm:cache_config_info"


def _prefixes(*names: str) -> tuple[str, ...]:
    return tuple(p for name in names for p in (f"{name}{{", f"{name} ", f"# TYPE {name} ", f"# HELP {name} "))


def _lines(text: str, prefixes: tuple[str, ...]) -> str:
    """The exposition's lines of some families only, for the parser (a line scan, not a full parse)."""
    return "\n".join(line for line in text.splitlines() if line.lstrip().startswith(prefixes)) + "\n"


_PREFIXES = _prefixes(*FAMILIES)
_CACHE_CONFIG_PREFIXES = _prefixes(CACHE_CONFIG_INFO)


def _engine(labels: Mapping[str, str]) -> int:
    value = labels.get("engine", "0")
    return int(value) if value.isdigit() else 0


def parse_vllm_metrics(text: str) -> dict[int, BackendObservation]:
    """Observations keyed by engine index; raises ``ValueError`` on a malformed exposition."""
    values: dict[int, dict[str, float]] = {}
    for family in text_string_to_metric_families(_lines(text, _PREFIXES)):
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
    targets: Sequence[Target],
    parsed: Mapping[int, BackendObservation],
    kv_sizes: Mapping[int, int] | None = None,
) -> dict[str, BackendObservation]:
    """Map engine observations to the targets (Ranks) of one worker URL, keyed by target id; with
    ``kv_sizes`` (``kv_capacities`` of the same page) each carries its Rank's KV size when reported."""
    if not kv_sizes:
        return {t.id: parsed[t.rank] for t in targets if t.rank in parsed}
    return {
        t.id: replace(parsed[t.rank], kv_capacity_tokens=kv_sizes.get(t.rank))
        for t in targets
        if t.rank in parsed
    }


def kv_capacities(text: str) -> dict[int, int]:
    """KV tokens per engine (Rank) from ``vllm:cache_config_info``; {} when not reported or malformed.

    ``kv_cache_size_tokens`` when present: with ``--data-parallel-size 2`` vLLM 0.32 labels each engine with
    ``num_gpu_blocks`` summed over the Ranks (1024 for 512 per Rank) but the per-engine token size right.
    Otherwise ``num_gpu_blocks × block_size`` (older vLLM, the emulator).
    """
    if CACHE_CONFIG_INFO not in text:
        return {}
    sizes: dict[int, int] = {}
    try:
        for family in text_string_to_metric_families(_lines(text, _CACHE_CONFIG_PREFIXES)):
            for sample in family.samples:
                labels = sample.labels
                engine = labels.get("engine", "0")
                tokens = labels.get("kv_cache_size_tokens", "")
                blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
                if not engine.isdigit():
                    continue
                if tokens.isdigit():
                    sizes[int(engine)] = int(tokens)
                elif blocks.isdigit() and size.isdigit():
                    sizes[int(engine)] = int(blocks) * int(size)
    except ValueError:
        return {}
    return sizes
