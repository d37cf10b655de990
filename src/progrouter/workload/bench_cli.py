"""`progrouter bench`: the A/B benchmark of routing arms on one trace (see `progrouter.workload.bench`)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from progrouter.config import ConfigError, ProgramSchedulingConfig
from progrouter.engine.profiles import BUILTIN, load_profile, with_cost_models
from progrouter.workload import trace as trace_mod
from progrouter.workload.arms import ARMS, EngineFleet
from progrouter.workload.bench import Bench, BenchPlan, ExternalFleet, upstream_binary
from progrouter.workload.facts import Fact
from progrouter.workload.procs import ProcessError
from progrouter.workload.render import plot, print_report
from progrouter.workload.replay_cli import add_replay_arguments, options_from_args
from progrouter.workload.trace import Trace, TraceError
from progrouter.workload.trace_cli import WORKLOADS, add_workload_arguments, trace_from_args

DEFAULT_ARMS = "native,program,binding_only,oracle,upstream"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("workload (a trace file, or a synthetic workload)")
    src.add_argument("--trace", type=Path, default=None, help="a progrouter trace (JSONL)")
    src.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="coding",
        help="synthetic workload when no --trace is given",
    )
    add_workload_arguments(src)
    src.add_argument("--token-scale", type=float, default=1.0, help="multiply every token count of the trace")

    parser.add_argument(
        "--arms",
        default=DEFAULT_ARMS,
        help=f"comma-separated, from {', '.join(ARMS)} (default {DEFAULT_ARMS})",
    )
    parser.add_argument(
        "--program-config-json",
        default=None,
        help="Program-scheduling config of the program/binding_only/upstream arms "
        "(default: the recommended deployment: token capacity per Rank from the engines, global_queue, "
        "least_program_count binding, the adaptive acting TTL)",
    )
    parser.add_argument("--report-dir", type=Path, default=None, help="default bench-reports/<time>")
    parser.add_argument("--router-log-level", default="warning")
    parser.add_argument("--upstream-binary", default=None, help="path of vllm-router (default: on PATH)")

    eng = parser.add_argument_group("engine emulators the bench starts")
    d = EngineFleet()
    eng.add_argument("--engines", type=int, default=d.engines, help="emulator processes")
    eng.add_argument("--data-parallel-size", type=int, default=d.dp_size, help="Ranks per engine")
    eng.add_argument(
        "--engine-profile",
        default=None,
        metavar="NAME|FILE",
        help="the emulators' cost models and KV size, and the Program arms' cost models: "
        f"{', '.join(BUILTIN)} or a calibration.json",
    )
    eng.add_argument(
        "--num-blocks",
        type=int,
        default=None,
        help=f"KV blocks per Rank (default {d.num_blocks} or the profile's)",
    )
    eng.add_argument("--engine-block-size", type=int, default=d.block_size, help="tokens per KV block")
    eng.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    eng.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    eng.add_argument("--engine-arg", action="append", default=[], help="extra emulator flag (repeatable)")
    eng.add_argument(
        "--engine-base-port",
        type=int,
        default=None,
        help="engines listen on the first free ports from here (reproducible hash placement); "
        "default: any free port",
    )

    ext = parser.add_argument_group("engines you run (e.g. real vLLM)")
    ext.add_argument("--engine-urls", nargs="+", default=None, help="use these instead of emulators")
    ext.add_argument("--restart-command", default=None, help="shell command run before each arm (cold start)")

    add_replay_arguments(parser)


def _trace(args: argparse.Namespace) -> Trace:
    t = trace_mod.load(args.trace) if args.trace else trace_from_args(args.workload, args)
    t = t.scaled(token_scale=args.token_scale)
    return t.head(args.num_tasks) if args.num_tasks else t


#: The recommended deployment, one line for every model and load (docs/benchmarks/fleet.md): each Rank's KV
#: size as its vLLM reports it, the global queue, least-Program-count binding and the adaptive acting TTL.
RECOMMENDED_PROGRAM_CONFIG: dict[str, Any] = {
    "token_capacity_per_dp_rank": "auto",
    "global_queue": True,
    "binding_strategy": "least_program_count",
    "acting_ttl_policy": "adaptive",
}


def default_program_config() -> dict[str, Any]:
    """The recommended deployment (a copy to build on)."""
    return dict(RECOMMENDED_PROGRAM_CONFIG)


def with_engine_profile(
    spec: str | None, fleet: EngineFleet, program: dict[str, Any]
) -> tuple[EngineFleet, dict[str, Any]]:
    """The emulators run the profile's step costs (their own ``--engine-profile``; explicit flags such as the
    fleet's ``--num-blocks`` still win) and the Program arms model the same costs."""
    if spec is None:
        return fleet, program
    profile = load_profile(spec)
    where = str(Path(spec).resolve()) if Path(spec).is_file() else spec
    fleet = replace(fleet, extra_args=("--engine-profile", where, *fleet.extra_args))
    return fleet, with_cost_models(program, profile.prefill_cost_model, profile.decode_throughput_model)


def plan_from_args(args: argparse.Namespace, trace: Trace) -> BenchPlan:
    arms = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ConfigError(f"unknown arm(s) {unknown}; known: {list(ARMS)}")
    fleet: EngineFleet | ExternalFleet
    if args.engine_urls:
        fleet = ExternalFleet(
            tuple(u.rstrip("/") for u in args.engine_urls),
            args.data_parallel_size,
            args.time_scale,
            args.restart_command,
        )
    else:
        longest = max(
            (r.input_tokens + r.output_tokens for _t, p in trace.programs() for r in p.requests), default=1
        )
        num_blocks = args.num_blocks or EngineFleet().num_blocks
        if args.engine_profile and not args.num_blocks:
            num_blocks = load_profile(args.engine_profile).num_blocks(args.engine_block_size)
        fleet = EngineFleet(
            engines=args.engines,
            dp_size=args.data_parallel_size,
            num_blocks=num_blocks,
            block_size=args.engine_block_size,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=min(num_blocks * args.engine_block_size, max(longest + 16, 1024)),
            time_scale=args.time_scale,
            extra_args=tuple(args.engine_arg),
        )
        if longest > fleet.capacity_tokens:
            raise ConfigError(
                f"a request needs {longest} tokens but a Rank holds {fleet.capacity_tokens}: "
                "raise --num-blocks or lower --token-scale"
            )
    program = orjson.loads(args.program_config_json) if args.program_config_json else default_program_config()
    if isinstance(fleet, EngineFleet):
        fleet, program = with_engine_profile(args.engine_profile, fleet, program)
    ProgramSchedulingConfig.resolve(True, orjson.dumps(program).decode())  # fail early, naming the field
    report_dir = args.report_dir or Path("bench-reports") / time.strftime("%Y%m%d-%H%M%S")
    return BenchPlan(
        trace=trace, arms=arms, fleet=fleet, program_config=program, report_dir=report_dir,
        replay=options_from_args(args, ""), upstream_binary=args.upstream_binary,
        router_log_level=args.router_log_level, engine_base_port=args.engine_base_port,
    )  # fmt: skip


async def run_plan(plan: BenchPlan, console: Console) -> dict[str, Any] | None:
    """Run every arm with a progress bar; Ctrl-C stops the children and returns None."""
    with Progress(
        TextColumn("[bold]{task.description}[/bold]"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[errors]} errors"), TimeElapsedColumn(), console=console,
    ) as progress:  # fmt: skip

        def factory(arm: str, total: int) -> Callable[[Fact], None]:
            bar = progress.add_task(arm, total=total, errors=0)
            errors = 0

            def sink(f: Fact) -> None:
                nonlocal errors
                errors += f.status == "error"
                progress.update(bar, advance=1, errors=errors)

            return sink

        bench = Bench(plan, console, factory)
        main = asyncio.ensure_future(bench.run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, main.cancel)
        try:
            return await main
        except asyncio.CancelledError:
            console.print("[yellow]interrupted[/yellow]: engines and routers stopped")
            return None


def execute(
    plan: BenchPlan, console: Console, epilogue: Callable[[dict[str, Any]], None] | None = None
) -> int:
    """Run every arm of ``plan``, then report (and ``epilogue`` on the report, e.g. the demo's verdict);
    the exit code (1 a process failed, 130 interrupted)."""
    try:
        report = asyncio.run(run_plan(plan, console))
    except ProcessError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    if report is None:
        return 130
    finish(report, plan, console)
    if epilogue is not None:
        epilogue(report)
    return 0


def finish(report: dict[str, Any], plan: BenchPlan, console: Console) -> None:
    plot(report, plan.report_dir)
    print_report(report, console, plan.report_dir)


def run(args: argparse.Namespace) -> int:
    console = Console()
    try:
        trace = _trace(args)
        plan = plan_from_args(args, trace)
    except (ConfigError, TraceError, OSError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    if "upstream" in plan.arms and upstream_binary(plan.upstream_binary) is None:
        console.print("upstream arm skipped: vllm-router is not installed")
    console.print(
        f"trace: {len(trace.tasks)} tasks, {trace.num_requests} requests; API {plan.replay.api}; "
        f"report in {plan.report_dir}"
    )
    return execute(plan, console)
