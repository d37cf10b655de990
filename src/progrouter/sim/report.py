"""The simulator's report: the live bench's per-arm figures and comparisons, plus what the scheduler said.

Every figure comes from ``workload.report`` (``arm_figures`` on the simulated facts and scrapes, ``compare``
across arms), so a simulated and a live run of the same trace are read the same way. The report is a pure
function of the inputs: wall-clock timings are kept apart (``timing``), so the same trace, fleet and arms
give a byte-identical ``report.json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from progrouter.sim.ranks import FleetSpec
from progrouter.sim.simulation import ArmResult, unbounded_blocks
from progrouter.workload.facts import write_fact
from progrouter.workload.report import compare
from progrouter.workload.trace import Trace

REPORT_FORMAT = "progrouter-sim-report"
REPORT_VERSION = 1


def build_report(
    trace: Trace,
    fleet: FleetSpec,
    results: Sequence[ArmResult],
    program_config: dict[str, Any],
    *,
    max_concurrent_tasks: int | None = None,
) -> dict[str, Any]:
    arms = {r.arm.name: r.figures for r in results}
    return {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "trace": {
            "source": trace.source,
            "tasks": len(trace.tasks),
            "programs": sum(1 for _ in trace.programs()),
            "requests": trace.num_requests,
            "block_size": trace.block_size,
            "meta": trace.meta,
            "max_concurrent_tasks": max_concurrent_tasks,
        },
        "fleet": {
            "ranks": fleet.ranks,
            "num_blocks_per_rank": fleet.num_blocks,
            "block_size": fleet.block_size,
            "capacity_tokens_per_rank": fleet.capacity_tokens,
            "oracle_num_blocks_per_rank": unbounded_blocks(trace, fleet),
            "max_num_seqs": fleet.max_num_seqs,
            "max_num_batched_tokens": fleet.max_num_batched_tokens,
            "max_model_len": fleet.max_model_len,
        },
        "program_config": program_config,
        "arm_specs": {r.arm.name: r.arm.to_json() for r in results},
        "arms": arms,
        "comparison": compare(arms),
        "scheduler": {r.arm.name: r.scheduler for r in results if r.scheduler is not None},
    }


def timing(results: Sequence[ArmResult]) -> dict[str, Any]:
    """Wall-clock cost of each arm (not part of the deterministic report)."""
    return {
        r.arm.name: {
            "wall_seconds": r.wall_seconds,
            "virtual_seconds": r.virtual_seconds,
            "events": r.events,
            "speedup": r.virtual_seconds / r.wall_seconds if r.wall_seconds > 0 else None,
        }
        for r in results
    }


def dump(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)


def write_report(out: Path, report: dict[str, Any], results: Sequence[ArmResult]) -> Path:
    """``report.json``, ``timing.json``, and per arm its facts (and the scheduler's diagnostics)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.json"
    path.write_bytes(dump(report))
    (out / "timing.json").write_bytes(dump(timing(results)))
    for r in results:
        folder = out / r.arm.name
        folder.mkdir(exist_ok=True)
        with open(folder / "facts.jsonl", "wb") as f:
            for fact in r.facts:
                write_fact(f, fact)
        if r.diagnostics is not None:
            (folder / "diagnostics.json").write_bytes(dump(r.diagnostics))
    return path
