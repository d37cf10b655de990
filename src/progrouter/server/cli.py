"""`progrouter serve`: the upstream ``vllm-router`` 0.1.17 command line for regular HTTP routing.

Every regular-mode flag of the wheel is accepted with its name and default. Flags of features progrouter
does not have (PD disaggregation, WASM middleware, IGW, Kubernetes discovery) are parsed too, so that using
one ends startup with a single line that names it instead of an argparse usage dump. Flags are parsed with
no argparse defaults: what was not typed comes from the environment, the config file or ``RouterConfig``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from progrouter.config import ConfigError, Policy, ProgramSchedulingConfig, RouterConfig
from progrouter.server.settings import ENV_PREFIX, load_router_config

log = logging.getLogger("progrouter.router")
_DEFAULTS = RouterConfig()
_POLICIES = [p.value for p in Policy]
_LOG_LEVELS = ["debug", "info", "warning", "error", "critical"]

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


# The policies' knobs: (flag, help, value type); the dest and the default shown come from RouterConfig.
POLICY_FLAGS: tuple[tuple[str, str, type], ...] = (
    ("--cache-threshold", "cache_aware: minimum prefix match ratio (0.0-1.0)", float),
    ("--balance-abs-threshold", "cache_aware balances load when (max - min) > abs AND max > min * rel", int),
    ("--balance-rel-threshold", "cache_aware: see --balance-abs-threshold", float),
    ("--eviction-interval-secs", "cache_aware: seconds between prefix-tree evictions", float),
    ("--max-tree-size", "cache_aware: characters kept per worker, enforced at eviction", int),
    ("--router-temperature", "kv_aware: softmax temperature (0 selects minimum cost)", float),
    ("--kv-penalty-host", "kv_aware: host-tier KV transfer credit (0.0-1.0)", float),
    ("--kv-penalty-external", "kv_aware: external-tier KV transfer credit (0.0-1.0)", float),
    ("--kv-penalty-disk", "kv_aware: disk-tier KV transfer credit (0.0-1.0)", float),
    ("--kv-aware-session-affinity-ttl-secs", "kv_aware: session affinity idle TTL (1-31536000)", int),
    ("--kv-event-block-size", "kv_aware: KV block size of static event sources", int),
    ("--kv-event-model", "kv_aware: shared model identity of static event sources", str),
    (
        "--tokenizer",
        "kv_aware (progrouter's own): the model's tokenizer files (a directory with tokenizer.json, "
        "tokenizer_config.json), so text and chat prompts are matched by token; unset: by characters",
        str,
    ),
)
KV_EVENT_SOURCE_FLAGS = (
    (
        "--kv-event-source",
        "kv_aware: static ZMQ KV event source, one endpoint per DP Rank; repeat per worker",
    ),
    ("--kv-event-replay-source", "kv_aware: ZMQ replay endpoints matching a worker's event source"),
)


def _default_text(value: Any) -> str:
    if value is None:
        return "None"
    if hasattr(value, "value"):
        return str(value.value)
    if isinstance(value, float):
        return f"{value:g}"  # 600, not 600.0: as upstream's help shows it
    return str(value).replace("%", "%%")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "Route requests across vLLM workers; the command line of vllm-router 0.1.17 (regular mode).\n"
        f"Any setting can also come from --config FILE or a {ENV_PREFIX}<SETTING> environment variable;\n"
        "flags win over the environment, which wins over the file."
    )

    def a(flag: str, help_text: str, **kw: Any) -> None:
        """A settings flag: no argparse default (absent means 'not given'); the help shows the real one."""
        dest = flag.removeprefix("--").replace("-", "_")
        dest = kw.pop("dest", dest)
        default = kw.pop("shown_default", getattr(_DEFAULTS, dest, None))
        parser.add_argument(
            flag,
            dest=dest,
            default=argparse.SUPPRESS,
            help=f"{help_text} (default: {_default_text(default)})",
            **kw,
        )

    def flag(name: str, help_text: str) -> None:
        a(name, help_text, action="store_true", shown_default=False)

    parser.add_argument(
        "--version", action="version", version=f"progrouter {_package_version()} (vllm-router 0.1.17 CLI)"
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="YAML or JSON file of settings (keys are the flags' names with underscores); unknown keys "
        "are errors",
    )
    # Workers and listening
    a("--host", "address to listen on")
    a("--port", "port to listen on (0: any free port)", type=int)
    a("--worker-urls", "vLLM server URLs; more can be added at runtime (POST /add_worker)", nargs="*")
    a(
        "--intra-node-data-parallel-size",
        "DP Ranks per worker URL; Rank r is addressed with the header X-data-parallel-rank: r",
        type=int,
    )
    a("--api-key", "sent to workers as Authorization: Bearer <key>")
    a(
        "--worker-startup-timeout-secs",
        "how long serve (and POST /add_worker) waits for a worker to answer its health endpoint",
        type=float,
    )
    a("--worker-startup-check-interval", "seconds between those startup checks", type=float)
    a("--max-payload-size", "largest request body in bytes", type=int)
    a("--request-timeout-secs", "bound on one request to a worker", type=float)
    # Policy
    a("--policy", "native routing policy for requests without Program identity", choices=_POLICIES)
    for name, help_text, kind in POLICY_FLAGS:
        a(name, help_text, type=kind)
    for name, help_text in KV_EVENT_SOURCE_FLAGS:
        a(name, help_text, action="append", metavar="WORKER_URL=ENDPOINT[,ENDPOINT...]")
    # Retries and circuit breaker
    a("--retry-max-retries", "attempts per request in all (1: no retry)", type=int)
    a("--retry-initial-backoff-ms", "backoff before the first retry", type=int)
    a("--retry-max-backoff-ms", "largest backoff between retries", type=int)
    a("--retry-backoff-multiplier", "backoff growth per retry", type=float)
    a("--retry-jitter-factor", "random share of each backoff (0.0-1.0)", type=float)
    flag("--disable-retries", "no retries (same as --retry-max-retries 1)")
    a("--cb-failure-threshold", "failures within the window that open a worker's circuit", type=int)
    a("--cb-success-threshold", "half-open successes that close it again", type=int)
    a("--cb-timeout-duration-secs", "how long an open circuit stays open", type=float)
    a("--cb-window-duration-secs", "window the failures are counted in", type=float)
    flag("--disable-circuit-breaker", "no circuit breaker")
    # Health checks
    a("--health-failure-threshold", "consecutive failed checks that mark a worker unhealthy", type=int)
    a("--health-success-threshold", "consecutive passed checks that mark it healthy again", type=int)
    a("--health-check-timeout-secs", "timeout of one health check", type=float)
    a("--health-check-interval-secs", "seconds between health checks", type=float)
    a("--health-check-endpoint", "worker path probed by health checks")
    # Inbound limits
    a("--max-concurrent-requests", "requests served at once", type=int)
    a("--queue-size", "0: no queue, answer 429 at once; else requests wait for a slot", type=int)
    a("--queue-timeout-secs", "longest wait for a slot, from the request's arrival (then 408)", type=float)
    a("--rate-limit-tokens-per-second", "token bucket refill rate (unset: max-concurrent-requests)", type=int)
    # Requests, CORS, shutdown
    a("--request-id-headers", "headers read for the request id, first present wins", nargs="*")
    a("--cors-allowed-origins", "origins answered by CORS", nargs="*")
    a(
        "--drain-timeout-secs",
        "progrouter's own: on SIGTERM, how long in-flight requests may take to finish",
        type=float,
    )
    # Observability
    a("--prometheus-host", "address of the Prometheus /metrics listener")
    a(
        "--prometheus-port",
        "port of the Prometheus /metrics listener (0: any free port; 'off': no listener)",
    )
    a("--log-level", "log level", choices=_LOG_LEVELS)
    a("--log-dir", "also write a rotating log file (progrouter.log) in this directory")
    # Operators' views, progrouter's own (docs/dashboard.md)
    a("--log-format", "text, or json: one object per line", choices=["text", "json"])
    a("--dashboard", "where GET /dashboard is served", choices=["router", "prometheus", "off"])
    a("--otlp-traces-endpoint", "OpenTelemetry OTLP/HTTP traces URL (needs progrouter[otel])", metavar="URL")
    # Program scheduling
    flag("--enable-program-scheduling", "schedule requests that carry Program metadata")
    a(
        "--program-scheduling-config-json",
        "JSON object of Program scheduling settings (needs --enable-program-scheduling)",
        metavar="JSON",
        shown_default=None,
    )
    # The client edge, progrouter's own (docs/router.md "Security")
    a(
        "--client-api-key",
        "a bearer token clients must send (repeatable); none: an open router, as upstream",
        dest="client_api_keys",
        action="append",
        metavar="KEY",
    )
    a("--client-api-keys-file", "client keys, one per line (# comments)", metavar="PATH")
    a("--admin-api-key", "the key for admin routes (unset: any client key)", metavar="KEY")
    a("--client-header-timeout-secs", "408 when a client's request headers take longer", type=float)
    a("--client-body-timeout-secs", "408 when a client's request body takes longer", type=float)
    a("--client-keepalive-timeout-secs", "idle client connections are closed after it", type=float)
    a("--max-client-connections", "client connections at once; 503 past it", type=int)
    a(
        "--no-front-door",
        "serve every route through aiohttp's web layer (the front door serves the hot proxied routes)",
        dest="front_door",
        action="store_false",
        shown_default=True,
    )
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
    from progrouter.server.telemetry import setup_telemetry

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
