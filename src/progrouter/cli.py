"""`progrouter <command>`: one entry point; each command lives in its own module.

A command module exposes ``add_arguments(parser)`` and ``run(args) -> int``; it is imported only when its
command runs, so `progrouter engine` never pays for matplotlib and `progrouter serve` never for scipy.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("progrouter.server.cli", "run the router in front of vLLM workers"),
    "epp": ("progrouter.epp.cli", "an Envoy ext_proc endpoint picker around the Program scheduler"),
    "engine": ("progrouter.engine.cli", "run the vLLM-compatible engine emulator"),
    "replay": ("progrouter.workload.replay_cli", "replay an agent trace against a router or engine"),
    "trace": ("progrouter.workload.trace_cli", "generate, import and inspect agent traces"),
    "bench": ("progrouter.workload.bench_cli", "A/B benchmark of routing arms on one trace"),
    "simulate": ("progrouter.sim.cli", "discrete-event simulation of a trace under each routing arm"),
    "demo": ("progrouter.workload.demo_cli", "the built-in benchmark: native vs program vs oracle"),
    "calibrate": ("progrouter.calibrate.cli", "fit prefill/decode cost models on a live backend"),
    "top": ("progrouter.top", "the live dashboard in a terminal"),
}


def _build_parser(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, str | None]:
    parser = argparse.ArgumentParser(prog="progrouter", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    return parser, chosen


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser, _chosen = _build_parser(args_list)
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    result: int = module.run(args)
    return result
