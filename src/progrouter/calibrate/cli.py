"""`progrouter calibrate --url URL`: measure a live backend, fit both cost models, write calibration.json.

Exit status: 0 on success, 2 when the backend cannot be measured (unreachable, erroring, wrong model) or the
samples cannot be fitted; the reason is printed on stderr. Progress goes to stderr, and
``--emit-router-config`` prints only the JSON fragment on stdout, so it can be piped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from progrouter.calibrate.fit import FitError
from progrouter.calibrate.measure import CalibrationError, Measurement, Plan, measure
from progrouter.calibrate.report import (
    ALPHA_NOTE,
    build_calibration,
    fit_measurement,
    load_calibration,
    router_fragment,
    write_json,
)
from progrouter.config import ConfigError

DEFAULT_PLAN = Plan()


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _csv(values: tuple[int, ...]) -> str:
    return ",".join(str(v) for v in values)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0] if __doc__ else None
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="backend base URL, http://host:port (append @RANK to pin a DP Rank)")
    src.add_argument(
        "--from",
        dest="from_file",
        type=Path,
        metavar="CALIBRATION_JSON",
        help="skip measuring: reuse an existing calibration.json (for --emit-router-config/--plot)",
    )
    parser.add_argument("--model", help="served model name (default: the first one /v1/models lists)")
    parser.add_argument("--api-key", help="bearer token for the backend")
    parser.add_argument("--out", type=Path, default=Path("calibration.json"), help="default: %(default)s")
    parser.add_argument("--plot", type=Path, help="PNG of data against fit (default: --out with .png)")
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    parser.add_argument(
        "--emit-router-config",
        action="store_true",
        help="print the program_scheduling JSON fragment (six coefficients) on stdout",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    g = parser.add_argument_group("measurement plan")
    g.add_argument(
        "--prefill-lengths",
        type=_ints,
        default=DEFAULT_PLAN.prefill_lengths,
        help=f"cold prompt lengths in tokens (default {_csv(DEFAULT_PLAN.prefill_lengths)})",
    )
    g.add_argument("--prefill-repeats", type=int, default=DEFAULT_PLAN.prefill_repeats)
    g.add_argument(
        "--batch-sizes",
        type=_ints,
        default=DEFAULT_PLAN.batch_sizes,
        help=f"decode batch sizes (default {_csv(DEFAULT_PLAN.batch_sizes)})",
    )
    g.add_argument(
        "--decode-contexts",
        type=_ints,
        default=DEFAULT_PLAN.decode_contexts,
        help=f"per-request decode contexts in tokens (default {_csv(DEFAULT_PLAN.decode_contexts)})",
    )
    g.add_argument(
        "--decode-tokens",
        type=int,
        default=DEFAULT_PLAN.decode_tokens,
        help="tokens generated per decode request (default %(default)s)",
    )
    g.add_argument("--decode-repeats", type=int, default=DEFAULT_PLAN.decode_repeats)
    g.add_argument(
        "--warmup", type=int, default=DEFAULT_PLAN.warmup_requests, help="unrecorded first requests"
    )
    g.add_argument("--seed", type=int, default=DEFAULT_PLAN.seed)
    g.add_argument("--request-timeout", type=float, default=DEFAULT_PLAN.request_timeout_seconds)
    g.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiply measured times by this (for an emulator run with --time-scale X)",
    )


def _plan(args: argparse.Namespace) -> Plan:
    if args.prefill_repeats < 1 or args.decode_repeats < 1 or args.decode_tokens < 2 or args.time_scale <= 0:
        raise CalibrationError("repeats must be >= 1, --decode-tokens >= 2 and --time-scale > 0")
    return Plan(
        prefill_lengths=tuple(args.prefill_lengths),
        prefill_repeats=args.prefill_repeats,
        batch_sizes=tuple(args.batch_sizes),
        decode_contexts=tuple(args.decode_contexts),
        decode_tokens=args.decode_tokens,
        decode_repeats=args.decode_repeats,
        warmup_requests=max(0, args.warmup),
        seed=args.seed,
        request_timeout_seconds=args.request_timeout,
        time_scale=args.time_scale,
    )


def _measure_with_progress(args: argparse.Namespace, plan: Plan) -> Measurement:
    if args.quiet:
        return asyncio.run(measure(args.url, plan, model=args.model, api_key=args.api_key))
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]calibrate[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("connecting", total=plan.request_count())

        def tick(n: int, description: str) -> None:
            bar.update(task, advance=n, description=description)

        return asyncio.run(measure(args.url, plan, model=args.model, api_key=args.api_key, progress=tick))


def _summary(doc: dict[str, Any]) -> str:
    q = doc["fit_quality"]
    return "\n".join(
        [
            f"prefill: {doc['ttl_prefill_model_intercept_seconds']:.6g} s + "
            f"{doc['ttl_prefill_model_linear_seconds_per_1k_tokens']:.6g} s·x + "
            f"{doc['ttl_prefill_model_quadratic_seconds_per_1k_tokens_squared']:.6g} s·x²  "
            f"(x = k tokens; R² {q['prefill']['r_squared']:.4f}, n {q['prefill']['samples']})",
            f"decode step: {doc['decode_step_fixed_seconds']:.6g} s + "
            f"{doc['decode_step_seconds_per_request']:.6g} s·B + "
            f"{doc['decode_step_seconds_per_context_token']:.6g} s·C  "
            f"(R² {q['decode']['r_squared']:.4f}, n {q['decode']['samples']})",
        ]
    )


def run(args: argparse.Namespace) -> int:
    try:
        if args.from_file is not None:
            doc = load_calibration(args.from_file)
        else:
            plan = _plan(args)
            measurement = _measure_with_progress(args, plan)
            prefill, decode = fit_measurement(measurement)
            doc = build_calibration(measurement, prefill, decode)
            write_json(args.out, doc)
            print(f"wrote {args.out}", file=sys.stderr)
        if not args.no_plot and "samples" in doc:
            from progrouter.calibrate.plot import write_plot

            plot_path = args.plot or (args.out if args.from_file is None else args.from_file).with_suffix(
                ".png"
            )
            write_plot(plot_path, doc)
            print(f"wrote {plot_path}", file=sys.stderr)
        for warning in doc.get("warnings", []):
            print(f"warning: {warning}", file=sys.stderr)
        if "fit_quality" in doc:
            print(_summary(doc), file=sys.stderr)
        if args.emit_router_config:
            fragment = router_fragment(doc)
            print(f"note: {ALPHA_NOTE}", file=sys.stderr)
            print(json.dumps(fragment, indent=2))
    except (CalibrationError, FitError, ConfigError) as exc:
        print(f"progrouter calibrate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("progrouter calibrate: interrupted", file=sys.stderr)
        return 130
    return 0
