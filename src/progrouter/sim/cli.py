"""`progrouter simulate`: replay a trace under each routing arm in virtual time and compare them.

    progrouter simulate --generate coding --tasks 16 --ranks 2 --num-blocks 1024 --block-size 64 \\
        --arms native,program,oracle --program-config '{"token_capacity_per_dp_rank": "auto"}' \\
        --out sim-report

``"auto"`` as ``token_capacity_per_dp_rank`` is each Rank's KV size in tokens as its engine reports it
(``--num-blocks`` × block size), as live. ``--max-concurrent-tasks N`` runs at most N tasks at once, as
``progrouter replay`` does. ``--variant NAME=JSON`` adds a Program arm whose config is ``--program-config``
with JSON on top; ``--hint`` / ``--variant-hint NAME=HINT`` make the agents send
``kv_retention_ttl_seconds``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from progrouter.config import ConfigError
from progrouter.engine.profiles import BUILTIN, ProfileError, load_profile, with_cost_models
from progrouter.sim.arms import Hint, SimArm, parse_hint, standard_arm, variant_arm
from progrouter.sim.ranks import FleetSpec
from progrouter.sim.report import build_report, write_report
from progrouter.sim.simulation import ArmResult, Simulation
from progrouter.workload import trace as trace_mod
from progrouter.workload.bench_cli import default_program_config
from progrouter.workload.generators import CodingWorkload
from progrouter.workload.render import rank_table, summary_table
from progrouter.workload.trace import Trace, TraceError
from progrouter.workload.trace_cli import (
    WORKLOADS,
    add_scale_arguments,
    add_workload_arguments,
    trace_from_args,
)

DEFAULT_ARMS = "native,program,oracle"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("workload (a trace file, or a synthetic workload)")
    which = src.add_mutually_exclusive_group(required=True)
    which.add_argument("--trace", type=Path, default=None, help="a progrouter trace (JSONL)")
    which.add_argument(
        "--generate", choices=[*WORKLOADS, "long-tool"], default=None, help="synthetic workload"
    )
    add_workload_arguments(src)
    add_scale_arguments(parser)
    src.add_argument("--num-tasks", type=int, default=None, help="only the first N tasks of the trace")
    src.add_argument(
        "--max-concurrent-tasks",
        type=_positive_int,
        default=None,
        metavar="N",
        help="at most N tasks at once, the next starting when one ends (as the replay's; default: all)",
    )

    d = FleetSpec()
    fleet = parser.add_argument_group("simulated Ranks")
    fleet.add_argument("--ranks", type=int, default=d.ranks, help="data-parallel Ranks")
    fleet.add_argument(
        "--engine-profile",
        default=None,
        metavar="NAME|FILE",
        help=f"the Ranks' cost models and KV size, and the Program arms' cost models: {', '.join(BUILTIN)} "
        "or a calibration.json (default: reference costs, --num-blocks)",
    )
    fleet.add_argument(
        "--num-blocks",
        type=int,
        default=None,
        help=f"KV blocks per Rank (default {d.num_blocks} or the profile's)",
    )
    fleet.add_argument(
        "--engine-block-size",
        type=int,
        default=None,
        help="tokens per KV block (default: --block-size, i.e. the trace's blocks)",
    )
    fleet.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    fleet.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    fleet.add_argument("--max-model-len", type=int, default=None, help="default: a Rank's KV in tokens")
    # --block-size (from the workload group) is the trace's block size and, by default, the KV block size.
    parser.set_defaults(block_size=None)

    parser.add_argument("--arms", default=DEFAULT_ARMS, help=f"comma-separated (default {DEFAULT_ARMS})")
    parser.add_argument(
        "--program-config",
        default=None,
        help='ProgramSchedulingConfig JSON of the Program arms; "token_capacity_per_dp_rank": "auto" means '
        "each Rank's KV tokens, as live (default: the recommended deployment, {token_capacity_per_dp_rank: "
        "auto, global_queue: true, binding_strategy: least_program_count, acting_ttl_policy: adaptive})",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="an extra Program arm: --program-config with JSON on top (repeatable)",
    )
    parser.add_argument(
        "--hint",
        default=None,
        help="kv_retention_ttl_seconds the agents send on Program arms: SECONDS, next-gap[:MAX], short:MAX "
        "or none",
    )
    parser.add_argument(
        "--variant-hint", action="append", default=[], metavar="NAME=HINT", help="the hint of one arm"
    )
    parser.add_argument("--salt", default="progrouter", help="prompt token salt (as the replay's)")
    parser.add_argument("--out", type=Path, default=Path("sim-report"), help="report folder")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def load_trace(args: argparse.Namespace) -> Trace:
    if args.trace is not None:
        t = trace_mod.load(args.trace)
    else:
        if args.block_size is None:
            args.block_size = CodingWorkload().block_size
        t = trace_from_args(args.generate, args)
    t = t.scaled(token_scale=args.token_scale, time_scale=args.time_scale)
    return t.head(args.num_tasks) if args.num_tasks else t


def fleet_from_args(args: argparse.Namespace, trace: Trace) -> FleetSpec:
    block_size = args.engine_block_size or args.block_size or trace.block_size
    profile = load_profile(args.engine_profile) if args.engine_profile else None
    costs: dict[str, Any] = {}
    num_blocks = args.num_blocks or FleetSpec().num_blocks
    if profile is not None:
        costs = {"prefill_cost_model": profile.prefill_cost_model,
                 "decode_throughput_model": profile.decode_throughput_model}  # fmt: skip
        num_blocks = args.num_blocks or profile.num_blocks(block_size)
    return FleetSpec(
        ranks=args.ranks,
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        **costs,
    )


def _json_object(text: str, what: str) -> dict[str, Any]:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{what}: not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: expected a JSON object")
    return data


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"{what} {item!r}: expected NAME=VALUE")
        out[name.strip()] = value
    return out


def arms_from_args(args: argparse.Namespace, fleet: FleetSpec) -> tuple[list[SimArm], dict[str, Any]]:
    if args.program_config is None:
        base = default_program_config()
    else:
        base = _json_object(args.program_config, "--program-config")
    if args.engine_profile:
        base = with_cost_models(base, fleet.prefill_cost_model, fleet.decode_throughput_model)
    hint = parse_hint(args.hint)
    hints: dict[str, Hint] = {
        n: parse_hint(h) for n, h in _pairs(args.variant_hint, "--variant-hint").items()
    }
    variants = _pairs(args.variant, "--variant")
    arms: list[SimArm] = []
    for name in (a.strip() for a in args.arms.split(",") if a.strip()):
        if name not in variants:
            arms.append(standard_arm(name, base, hints.get(name, hint)))
    for name, text in variants.items():
        overrides = _json_object(text, f"--variant {name}")
        arms.append(variant_arm(name, base, overrides, hints.get(name, hint)))
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise ConfigError(f"arm names must be unique: {names}")
    unknown = sorted(set(hints) - set(names))
    if unknown:
        raise ConfigError(f"--variant-hint names no arm: {unknown}")
    return arms, base


def scheduler_table(report: dict[str, Any]) -> Table:
    """What the scheduler said per Program arm: TTLs armed, transitions, retention, windows, ledger."""
    table = Table(title="Program scheduler (from its observer and diagnostics)")
    table.add_column("figure")
    arms = report["scheduler"]
    for name in arms:
        table.add_column(name, justify="right")

    def row(label: str, fn: Any) -> None:
        cells = []
        for s in arms.values():
            try:
                v = fn(s)
            except (KeyError, TypeError):
                v = None
            cells.append("-" if v is None else (v if isinstance(v, str) else f"{v:.3g}"))
        table.add_row(label, *cells)

    ttl = "armed_ttl_seconds"
    row("TTLs armed", lambda s: s[ttl]["count"])
    row("  share TTL 0", lambda s: s[ttl]["zero_share"])
    row("  mean TTL s", lambda s: s[ttl]["mean"])
    row("  from hints", lambda s: s[ttl]["by_source"].get("request_hint", {}).get("count", 0))
    for reason in ("program_admit", "batch_gain_admit", "ttl_expired", "capacity_repair", "force_resume",
                   "cross_rank_resume", "max_segment_yield", "paused_retention_release"):  # fmt: skip
        row(reason, lambda s, r=reason: s["transitions"].get(r, 0))
    row("queue wait mean s", lambda s: s["queue_wait_seconds"].get("mean"))
    row("queue wait p90 s", lambda s: s["queue_wait_seconds"].get("p90"))
    row("queue wait max s", lambda s: s["queue_wait_seconds"].get("max"))
    row("interval p50 s", lambda s: s["request_interval_seconds"].get("p50"))
    row("miss impact p50 s", lambda s: s["cache_miss_impact_seconds"].get("p50"))
    row("fitted TTL at end s", lambda s: max(r["fitted_acting_ttl_seconds"] or 0 for r in s["end"]["ranks"]))
    row(
        "windows complete",
        lambda s: " ".join(
            f"{int(bool(r['request_window_complete']))}/{int(bool(r['continuity_window_complete']))}"
            for r in s["end"]["ranks"]
        ),
    )
    row("ledger at end", lambda s: s["end"]["ledger_tokens"])
    return table


def print_report(report: dict[str, Any], console: Console, results: list[ArmResult], out: Path) -> None:
    table = summary_table(report)
    table.title = "progrouter simulate (virtual seconds; × = ratio to native)"
    console.print(table)
    console.print(rank_table(report))
    if report["scheduler"]:
        console.print(scheduler_table(report))
    fleet = report["fleet"]
    console.print(
        f"fleet: {fleet['ranks']} Ranks × {fleet['num_blocks_per_rank']} blocks × {fleet['block_size']} "
        f"tokens = {fleet['capacity_tokens_per_rank']:,} KV tokens per Rank "
        f"(oracle: {fleet['oracle_num_blocks_per_rank']} blocks)"
    )
    for r in results:
        console.print(
            f"{r.arm.name}: {r.virtual_seconds:,.0f} virtual s in {r.wall_seconds:.1f} wall s "
            f"({r.events:,} events); {orjson.dumps(r.arm.describe()).decode()}"
        )
    console.print(f"report: {out / 'report.json'}")


def run(args: argparse.Namespace) -> int:
    console = Console(width=None if sys.stdout.isatty() else 200)
    try:
        trace = load_trace(args)
        fleet = fleet_from_args(args, trace)
        arms, base = arms_from_args(args, fleet)
    except (TraceError, ConfigError, ProfileError, OSError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    console.print(
        f"trace {trace.source or args.trace}: {len(trace.tasks)} tasks "
        f"({args.max_concurrent_tasks or 'all'} at once), {trace.num_requests} requests; "
        f"arms {', '.join(a.name for a in arms)}"
    )
    results: list[ArmResult] = []
    for arm in arms:
        started = time.perf_counter()
        with console.status(f"simulating {arm.name}"):
            sim = Simulation(
                trace, fleet, arm, salt=args.salt, max_concurrent_tasks=args.max_concurrent_tasks
            )
            results.append(sim.run())
        console.print(f"  {arm.name}: done in {time.perf_counter() - started:.1f} s")
    report = build_report(trace, fleet, results, base, max_concurrent_tasks=args.max_concurrent_tasks)
    write_report(args.out, report, results)
    print_report(report, console, results, args.out)
    return 0
