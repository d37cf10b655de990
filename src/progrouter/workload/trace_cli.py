"""`progrouter trace generate | import | stats`: make agent traces and check them for reuse opportunities."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from progrouter.config import ProgramSchedulingConfig
from progrouter.workload import trace as trace_mod
from progrouter.workload.agentic import AgenticWorkload, generate_agentic
from progrouter.workload.facts import is_facts_file, load_facts
from progrouter.workload.generators import CodingWorkload, generate, long_tool_workload
from progrouter.workload.importers import IMPORTERS
from progrouter.workload.stats import fact_intervals, summarize, trace_intervals, trace_shape
from progrouter.workload.trace import Trace, TraceError


def add_scale_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--token-scale", type=float, default=1.0, help="multiply every token count (default 1)")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply every gap and start (default 1)")


def add_workload_arguments(p: argparse._ActionsContainer) -> None:
    """The synthetic workload's knobs (shared with `progrouter bench`)."""
    d = CodingWorkload()
    g = d.gaps
    p.add_argument("--tasks", type=int, default=d.tasks)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--block-size", type=int, default=d.block_size)
    p.add_argument("--system-prompt-tokens", type=int, default=d.system_prompt_tokens)
    p.add_argument("--task-prompt-tokens", type=int, default=d.task_prompt_tokens)
    p.add_argument("--turns-min", type=int, default=d.turns_min)
    p.add_argument("--turns-max", type=int, default=d.turns_max)
    p.add_argument("--tool-result-tokens", type=int, default=d.tool_result_tokens_median, help="median")
    p.add_argument("--output-tokens", type=int, default=d.output_tokens_median, help="median")
    p.add_argument("--output-tokens-max", type=int, default=d.output_tokens_max)
    p.add_argument(
        "--max-context-tokens",
        type=int,
        default=None,
        help=f"context cap (coding: {d.max_context_tokens}, ends the Program; "
        f"agentic: {AgenticWorkload().max_context_tokens}, compacts the session)",
    )
    p.add_argument("--gap-median", type=float, default=None, help=f"seconds (coding: {g.median})")
    p.add_argument("--gap-sigma", type=float, default=None, help=f"log-normal sigma (coding: {g.sigma})")
    p.add_argument("--long-gap-prob", type=float, default=None, help=f"share of long gaps ({g.long_prob})")
    p.add_argument("--long-gap-median", type=float, default=None, help=f"seconds ({g.long_median})")
    p.add_argument(
        "--subagent-prob", type=float, default=None, help=f"per lead turn ({d.subagent_spawn_prob})"
    )
    p.add_argument("--subagents-max", type=int, default=d.subagents_max)
    p.add_argument("--task-interarrival", type=float, default=d.task_interarrival, help="seconds")


def workload_from_args(kind: str, args: argparse.Namespace) -> CodingWorkload:
    w = long_tool_workload() if kind == "long_tool" else CodingWorkload()
    gaps = w.gaps
    gap_overrides = {
        "median": args.gap_median,
        "sigma": args.gap_sigma,
        "long_prob": args.long_gap_prob,
        "long_median": args.long_gap_median,
    }
    gaps = replace(gaps, **{k: v for k, v in gap_overrides.items() if v is not None})
    names = {f.name for f in fields(CodingWorkload)}
    given: dict[str, Any] = {
        "tasks": args.tasks,
        "seed": args.seed,
        "block_size": args.block_size,
        "system_prompt_tokens": args.system_prompt_tokens,
        "task_prompt_tokens": args.task_prompt_tokens,
        "turns_min": args.turns_min,
        "turns_max": args.turns_max,
        "tool_result_tokens_median": args.tool_result_tokens,
        "output_tokens_median": args.output_tokens,
        "output_tokens_max": args.output_tokens_max,
        "max_context_tokens": args.max_context_tokens or w.max_context_tokens,
        "subagents_max": args.subagents_max,
        "task_interarrival": args.task_interarrival,
        "gaps": gaps,
    }
    if args.subagent_prob is not None:
        given["subagent_spawn_prob"] = args.subagent_prob
    assert set(given) <= names
    return replace(w, **given)


WORKLOADS = ("coding", "long_tool", "agentic")


def trace_from_args(kind: str, args: argparse.Namespace) -> Trace:
    """The synthetic trace ``kind`` (``long-tool`` = ``long_tool``) with the workload flags in ``args``."""
    kind = kind.replace("-", "_")
    if kind != "agentic":
        return generate(workload_from_args(kind, args))
    d = AgenticWorkload()
    return generate_agentic(
        AgenticWorkload(
            tasks=args.tasks,
            seed=args.seed,
            block_size=args.block_size or d.block_size,
            max_context_tokens=args.max_context_tokens or d.max_context_tokens,
            task_interarrival=args.task_interarrival,
        )
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="trace_command", metavar="SUBCOMMAND", required=True)
    gen = sub.add_parser("generate", help="write a synthetic workload")
    gen.add_argument("kind", choices=WORKLOADS)
    gen.add_argument("-o", "--out", type=Path, required=True)
    add_workload_arguments(gen)
    add_scale_arguments(gen)

    imp = sub.add_parser("import", help="convert another tool's trace to ours")
    imp.add_argument("--format", choices=sorted(IMPORTERS), required=True)
    imp.add_argument("files", type=Path, nargs="+")
    imp.add_argument("-o", "--out", type=Path, required=True)
    imp.add_argument("--block-size", type=int, default=None, help="for formats that carry none")
    add_scale_arguments(imp)

    st = sub.add_parser("stats", help="intervals vs cache-miss impact: does the workload have reuse?")
    st.add_argument("file", type=Path, help="a progrouter trace or a replay facts file")
    st.add_argument("--config-json", default=None, help="Program-scheduling config JSON (prefill model)")
    st.add_argument("--json", action="store_true", help="print the figures as JSON")


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    try:
        if args.trace_command == "generate":
            t = trace_from_args(args.kind, args)
            return _save(
                t.scaled(token_scale=args.token_scale, time_scale=args.time_scale), args.out, console
            )
        if args.trace_command == "import":
            t = IMPORTERS[args.format](args.files, args.block_size)
            return _save(
                t.scaled(token_scale=args.token_scale, time_scale=args.time_scale), args.out, console
            )
        return _stats(args)
    except (TraceError, OSError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1


def _save(t: Trace, out: Path, console: Console) -> int:
    trace_mod.save(t, out)
    console.print(
        f"wrote {out}: {len(t.tasks)} tasks, {sum(1 for _ in t.programs())} Programs, "
        f"{t.num_requests} requests"
    )
    return 0


def _stats(args: argparse.Namespace) -> int:
    cfg = ProgramSchedulingConfig.resolve(True, args.config_json)
    assert cfg is not None
    model = cfg.prefill_cost_model
    if is_facts_file(args.file):
        intervals = fact_intervals(load_facts(args.file), model)
        source = "replay facts (measured, modelled seconds)"
        shape = None
    else:
        trace = trace_mod.load(args.file)
        intervals = trace_intervals(trace, model)
        source = "trace (planned gaps)"
        shape = trace_shape(trace)
    figures = summarize(intervals)
    figures["source"] = source
    if shape is not None:
        figures["shape"] = shape
    if args.json:
        sys.stdout.write(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print_stats(figures, Console())
    return 0


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:.3g}"


def print_stats(f: dict[str, Any], console: Console) -> None:
    console.print(f"[bold]{f['source']}[/bold]: {f['programs']} Programs, {f['intervals']} intervals")
    console.print(
        f"intervals below cache-miss impact: [bold]{_fmt(f['share_below_impact'], True)}[/bold]; "
        f"within 1 s: {_fmt(f['share_within_1s'], True)}; within 10 s: {_fmt(f['share_within_10s'], True)}"
    )
    iv, im = f["interval_seconds"], f["impact_seconds"]
    console.print(
        f"interval p50/p90/p99: {_fmt(iv['p50'])}/{_fmt(iv['p90'])}/{_fmt(iv['p99'])} s; "
        f"impact p50/p90: {_fmt(im['p50'])}/{_fmt(im['p90'])} s"
    )
    table = Table("context tokens", "intervals", "median interval s", "median impact s", "below impact")
    for b in f["by_context"]:
        table.add_row(
            b["context_tokens"],
            str(b["intervals"]),
            _fmt(b["median_interval_seconds"]),
            _fmt(b["median_impact_seconds"]),
            _fmt(b["share_below_impact"], True),
        )
    console.print(table)
    console.print(f"verdict: {f['verdict']}")
    if "shape" in f:
        print_shape(f["shape"], console)


def print_shape(shape: dict[str, Any], console: Console) -> None:
    """The workload's shape: one row per distribution, its quantiles."""
    table = Table("shape", "quantiles", title=f"{shape['sessions']} sessions, {shape['requests']} requests")
    for key in ("input_tokens", "growth_tokens", "output_tokens", "turns_per_session", "gap_seconds"):
        table.add_row(key, "  ".join(f"{p} {_fmt(v)}" for p, v in shape[key].items()))
    table.add_row("gaps within 1 s / 10 s", f"{_fmt(shape['gap_share_within_1s'], True)} / "
                  f"{_fmt(shape['gap_share_within_10s'], True)}")  # fmt: skip
    table.add_row("sessions with subagents", _fmt(shape["subagent_session_share"], True))
    console.print(table)
