"""`progrouter demo`: what Program scheduling does to an agent workload, next to native routing, in minutes.

The built-in benchmark: a synthetic coding-agent workload (32 tasks, 16 at a time, growing contexts, mostly
short tool calls with a long tail, blocking subagents, a system prompt shared by all tasks) replayed against
one engine emulator with two DP Ranks of 32,000 KV tokens, through the arms ``native``, ``program`` and
``oracle`` (plus ``upstream`` when the ``vllm-router`` package is installed). The point was chosen in the
simulator so that native routing evicts contexts its agents come back for (67% token cache hit against the
oracle's 91%, seeds 1-3) while the live run still fits in about three and a half minutes on two cores; nothing
in the workload was tuned to favour an arm. The demo ends with the measured hit gap and one line: the Program
arm's mean JCT as a ratio of native's and the prefill GPU-seconds it saved.

The ``program`` arm runs the configuration docs/benchmark.md recommends for a first deployment: the token
capacity of one Rank, the global queue, and the binding strategy that measured best on this benchmark.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from progrouter.config import PrefillCostModel, ProgramSchedulingConfig
from progrouter.engine.profiles import BUILTIN, load_profile
from progrouter.workload.apis import API_NAMES
from progrouter.workload.arms import EngineFleet
from progrouter.workload.bench import BenchPlan, upstream_binary
from progrouter.workload.bench_cli import default_program_config, execute, with_engine_profile
from progrouter.workload.facts import load_facts
from progrouter.workload.generators import CodingWorkload, generate
from progrouter.workload.replay import ReplayOptions
from progrouter.workload.report import figure, prefill_gpu_seconds, ratio
from progrouter.workload.stats import summarize, trace_intervals
from progrouter.workload.trace import Trace

DEMO_WORKLOAD = CodingWorkload(
    tasks=32,
    seed=1,
    block_size=16,
    system_prompt_tokens=2048,
    task_prompt_tokens=1024,
    turns_min=12,
    turns_max=28,
    tool_result_tokens_median=384,
    output_tokens_median=48,
    output_tokens_max=256,
    max_context_tokens=24_000,
    subagent_spawn_prob=0.08,
    subagents_max=2,
)
#: 16 at a time (32 at once overloads the emulator on two cores: its live oracle was no faster than native).
DEMO_CONCURRENT_TASKS = 16
#: Engines listen on the first free port from here, so the consistent-hash placement repeats run to run.
DEMO_ENGINE_BASE_PORT = 18800
DEMO_FLEET = EngineFleet(
    engines=1,
    dp_size=2,
    num_blocks=2000,
    block_size=16,
    max_num_seqs=64,
    max_model_len=24_576,
    time_scale=10.0,
)


def recommended_config(fleet: EngineFleet) -> dict[str, Any]:
    """The recommended deployment (``progrouter bench``'s default Program config) on the demo's fleet."""
    return default_program_config()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--report-dir", type=Path, default=None, help="default demo-reports/<time>")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=DEMO_FLEET.time_scale,
        help="modelled seconds per wall second (lower is more faithful and slower)",
    )
    parser.add_argument("--tasks", type=int, default=DEMO_WORKLOAD.tasks, help="fewer for a quicker look")
    parser.add_argument(
        "--engine-profile",
        default=None,
        metavar="NAME|FILE",
        help=f"step costs of the emulators and the Program arm ({', '.join(BUILTIN)} or a calibration.json); "
        "the demo keeps its own KV size",
    )
    parser.add_argument(
        "--api",
        choices=list(API_NAMES),
        default="completions",
        help="the replay's API shape (as `progrouter bench --api`); messages and responses send identity in "
        "Claude Code's or Codex's headers, and the program arm reads it with enable key auto",
    )
    parser.add_argument("--no-upstream", action="store_true", help="skip the vllm-router arm")
    parser.add_argument("--upstream-binary", default=None, help="path of vllm-router (default: on PATH)")


def demo_trace(tasks: int) -> Trace:
    return generate(replace(DEMO_WORKLOAD, tasks=tasks))


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def verdict(report: dict[str, Any], report_dir: Path, prefill: PrefillCostModel) -> list[str]:
    """The demo's conclusion from ``report``: how far native's token cache hit sits below the oracle's, and
    the Program arm's mean JCT as a ratio of native's with the prefill GPU-seconds it saved against native
    (``prefill`` applied to each request's uncached tokens, from every arm's ``facts.jsonl``)."""
    arms = report["arms"]
    hit = {a: figure(f, "token_cache_hit") for a, f in arms.items()}
    native, oracle = hit.get("native"), hit.get("oracle")
    lines = [f"token cache hit: native {_pct(native)}, oracle (unbounded KV) {_pct(oracle)}"]
    if native is not None and oracle is not None:
        lines[0] += f": native routing loses {100 * (oracle - native):.0f} points to eviction"
    if "native" not in arms or "program" not in arms:
        return lines
    spent = {a: prefill_gpu_seconds(load_facts(report_dir / a / "facts.jsonl"), prefill) for a in arms}
    jct = ratio(figure(arms["program"], "jct_seconds.mean"), figure(arms["native"], "jct_seconds.mean"))
    lines.append(
        f"program: {'-' if jct is None else f'{jct:.2f}'}x native mean JCT, token cache hit "
        f"{_pct(hit.get('program'))}, {spent['native'] - spent['program']:,.0f} prefill GPU-seconds saved "
        f"({spent['program']:,.0f} spent vs native's {spent['native']:,.0f}; modelled)"
    )
    return lines


def run(args: argparse.Namespace) -> int:
    console = Console()
    trace = demo_trace(args.tasks)
    fleet = replace(DEMO_FLEET, time_scale=args.time_scale)
    try:
        fleet, program = with_engine_profile(args.engine_profile, fleet, recommended_config(fleet))
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    arms = ["native", "program", "oracle"]
    if not args.no_upstream and upstream_binary(args.upstream_binary) is not None:
        arms.append("upstream")
    prefill = (
        load_profile(args.engine_profile).prefill_cost_model
        if args.engine_profile
        else ProgramSchedulingConfig().prefill_cost_model
    )
    reuse = summarize(trace_intervals(trace, prefill))
    report_dir = args.report_dir or Path("demo-reports") / time.strftime("%Y%m%d-%H%M%S")
    console.print(
        f"[bold]progrouter demo[/bold]: {len(trace.tasks)} coding-agent tasks ({DEMO_CONCURRENT_TASKS} at a "
        f"time), {trace.num_requests} requests; {fleet.dp_size} Ranks x {fleet.capacity_tokens:,} KV tokens; "
        f"time compressed {fleet.time_scale:g}x\n"
        f"reuse check: {100 * (reuse['share_below_impact'] or 0):.0f}% of tool gaps are shorter than the "
        f"cache-miss impact of their context ({reuse['verdict']})\n"
        f"arms: {', '.join(arms)}; API: {args.api}; program config: {program}"
    )
    plan = BenchPlan(
        trace=trace,
        arms=tuple(arms),
        fleet=fleet,
        program_config=program,
        report_dir=report_dir,
        replay=ReplayOptions(url="", api=args.api, max_concurrent_tasks=DEMO_CONCURRENT_TASKS),
        upstream_binary=args.upstream_binary,
        engine_base_port=DEMO_ENGINE_BASE_PORT,
    )

    def conclude(report: dict[str, Any]) -> None:
        console.print(f"replayed through the {args.api} API", highlight=False)
        for line in verdict(report, report_dir, prefill):
            console.print(line, style="bold", soft_wrap=True, highlight=False)

    return execute(plan, console, conclude)
