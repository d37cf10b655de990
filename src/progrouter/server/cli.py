"""`progrouter serve`: the upstream ``vllm-router`` 0.1.17 command line for regular HTTP routing.

Every regular-mode flag of the wheel is accepted with its name and default. Flags of features progrouter
does not have (PD disaggregation, WASM middleware, IGW, Kubernetes discovery) are parsed too, so that using
one ends startup with a single line that names it instead of an argparse usage dump. The settings' flags are
generated from ``RouterConfig`` (``progrouter.config_cli``) and parsed with no argparse defaults: what was
not typed comes from the environment, the config file or ``RouterConfig``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from pydantic import BaseModel, Field

from progrouter.config import ConfigError, ProgramSchedulingConfig, RouterConfig, setting
from progrouter.config_cli import add_model_arguments
from progrouter.server.settings import ENV_PREFIX, load_router_config

log = logging.getLogger("progrouter.router")

PD_FLAGS = (
    "--vllm-pd-disaggregation",
    "--prefill",
    "--decode",
    "--prefill-policy",
    "--decode-policy",
    "--pd-kv-events",
    "--prefill-selector",
    "--decode-selector",
    "--vllm-discovery-address",
    "--kv-connector",
    "--mini-lb",
)
UNSUPPORTED_FLAGS = {
    "--wasm-middleware": "WASM middleware",
    "--wasm-middleware-sha256": "WASM middleware",
    "--wasm-middleware-route": "WASM middleware",
    "--enable-igw": "IGW (multi-model gateway) mode",
    "--service-discovery": "Kubernetes service discovery",
    "--selector": "Kubernetes service discovery",
    "--service-discovery-port": "Kubernetes service discovery",
    "--service-discovery-namespace": "Kubernetes service discovery",
}


class ProgramSchedulingFlags(BaseModel):
    """Upstream's two command-line inputs of Program scheduling: the switch and the JSON it enables.

    ``ProgramSchedulingConfig.resolve`` turns them into ``RouterConfig.program_scheduling``; a config file
    or the environment sets that field directly.
    """

    enable_program_scheduling: bool = Field(
        default=False,
        description="schedule requests that carry Program metadata",
        json_schema_extra=setting(group="Program scheduling"),
    )
    program_scheduling_config_json: str | None = Field(
        default=None,
        description="JSON object of Program scheduling settings (needs --enable-program-scheduling)",
        json_schema_extra=setting(metavar="JSON"),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "Route requests across vLLM workers; the command line of vllm-router 0.1.17 (regular mode).\n"
        f"Any setting can also come from --config FILE or a {ENV_PREFIX}<SETTING> environment variable;\n"
        "flags win over the environment, which wins over the file (docs/reference/settings.md)."
    )
    parser.add_argument(
        "--version", action="version", version=f"progrouter {_package_version()} (vllm-router 0.1.17 CLI)"
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="YAML or JSON file of settings, keyed by their names in docs/reference/settings.md (mostly the "
        "flags' names with underscores); unknown keys are errors",
    )
    add_model_arguments(parser, RouterConfig)
    add_model_arguments(parser, ProgramSchedulingFlags)
    # Not supported: parsed so that the error is one line naming the flag
    refused = parser.add_argument_group("vllm-router flags progrouter refuses (startup ends naming the flag)")
    for name in PD_FLAGS:
        refused.add_argument(name, nargs="*", default=argparse.SUPPRESS, metavar="ARG", help="PD mode")
    for name, feature in UNSUPPORTED_FLAGS.items():
        refused.add_argument(name, nargs="*", default=argparse.SUPPRESS, metavar="ARG", help=feature)


def _package_version() -> str:
    try:
        return version("progrouter")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without metadata
        return "unknown"


def _given_flags(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(args).items() if k not in ("command", "config")}


def refuse_unsupported(args: argparse.Namespace) -> str | None:
    """One line naming the first flag of a feature progrouter does not have, or None."""
    given = _given_flags(args)
    for name in PD_FLAGS:
        if name.removeprefix("--").replace("-", "_") in given:
            return (
                f"{name}: PD (prefill/decode disaggregated) mode is not supported by progrouter; "
                "run it in regular mode with --worker-urls"
            )
    for name, feature in UNSUPPORTED_FLAGS.items():
        if name.removeprefix("--").replace("-", "_") in given:
            return f"{name}: {feature} is not supported by progrouter"
    return None


def config_from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> RouterConfig:
    """The RouterConfig the flags (over environment and config file) describe; ConfigError names the field."""
    flags = _given_flags(args)
    enable = flags.pop("enable_program_scheduling", False)
    raw_json = flags.pop("program_scheduling_config_json", None)
    if enable or raw_json is not None:
        flags["program_scheduling"] = ProgramSchedulingConfig.resolve(enable, raw_json)
    flags = {k: v for k, v in flags.items() if k in RouterConfig.model_fields}
    return load_router_config(flags, getattr(args, "config", None), environ)


def _event_loop_runner() -> Callable[[Coroutine[Any, Any, int]], int]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        return asyncio.run

    def run(main: Coroutine[Any, Any, int]) -> int:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)

    return run


def run(args: argparse.Namespace) -> int:
    refused = refuse_unsupported(args)
    if refused is not None:
        print(f"progrouter serve: {refused}", file=sys.stderr)
        return 2
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"progrouter serve: {exc}", file=sys.stderr)
        return 2
    from progrouter.server.lifecycle import serve
    from progrouter.server.telemetry.setup import setup_telemetry

    try:
        setup_telemetry(config)
    except OSError as exc:
        print(f"progrouter serve: log_dir: cannot write logs in {config.log_dir}: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:  # e.g. tracing asked for without the otel extra
        print(f"progrouter serve: {exc}", file=sys.stderr)
        return 2
    try:
        return _event_loop_runner()(serve(config))
    except ConfigError as exc:  # found while building the router, e.g. an unreadable --tokenizer
        print(f"progrouter serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"progrouter serve: cannot listen: {exc}", file=sys.stderr)
        return 1
