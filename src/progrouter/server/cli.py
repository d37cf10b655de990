"""`progrouter serve`: the upstream ``vllm-router`` command line for regular HTTP routing."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from progrouter.config import ConfigError, Policy, ProgramSchedulingConfig, RouterConfig, parse_config

log = logging.getLogger("progrouter.router")
_DEFAULTS = RouterConfig()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = _DEFAULTS
    a = parser.add_argument
    a("--worker-urls", nargs="+", required=True, metavar="URL", help="vLLM server URLs")
    a("--host", default=d.host, help="address to listen on")
    a("--port", type=int, default=d.port, help="port to listen on (0: any free port)")
    a("--policy", choices=[p.value for p in Policy], default=d.policy.value, help="native routing policy")
    a(
        "--intra-node-data-parallel-size",
        type=int,
        default=d.intra_node_data_parallel_size,
        help="DP Ranks per worker URL; Rank r is addressed with the header X-data-parallel-rank: r",
    )
    a("--api-key", default=None, help="sent to workers as Authorization: Bearer <key>")
    a(
        "--cache-threshold",
        type=float,
        default=d.cache_threshold,
        help="cache_aware: minimum prefix match ratio",
    )
    a("--balance-abs-threshold", type=int, default=d.balance_abs_threshold, help="cache_aware: load gap")
    a("--balance-rel-threshold", type=float, default=d.balance_rel_threshold, help="cache_aware: load ratio")
    a("--max-tree-size", type=int, default=d.max_tree_size, help="cache_aware: characters kept per target")
    a("--max-payload-size", type=int, default=d.max_payload_size, help="largest request body in bytes")
    a("--request-timeout-secs", type=float, default=d.request_timeout_secs, help="bound on one request")
    a("--retry-max-retries", type=int, default=d.retry_max_retries, help="re-sends to another Rank")
    a("--health-check-interval-secs", type=float, default=d.health_check_interval_secs)
    a("--health-check-timeout-secs", type=float, default=d.health_check_timeout_secs)
    a("--health-check-endpoint", default=d.health_check_endpoint)
    a("--health-failure-threshold", type=int, default=d.health_failure_threshold)
    a("--health-success-threshold", type=int, default=d.health_success_threshold)
    a("--prometheus-host", default=d.prometheus_host)
    a("--prometheus-port", type=int, default=d.prometheus_port, help="0: any free port")
    a("--log-level", choices=["debug", "info", "warning", "error", "critical"], default=d.log_level)
    a(
        "--enable-program-scheduling",
        action="store_true",
        help="schedule requests that carry Program metadata (see docs/program_scheduling.md)",
    )
    a("--program-scheduling-config-json", default=None, metavar="JSON", help="Program scheduling knobs")
    # The client edge (docs/router.md "Security")
    a(
        "--client-api-key",
        dest="client_api_keys",
        action="append",
        default=[],
        metavar="KEY",
        help="a bearer token clients must send (repeatable); none: an open router, as upstream",
    )
    a("--client-api-keys-file", default=None, metavar="PATH", help="client keys, one per line (# comments)")
    a(
        "--admin-api-key",
        default=None,
        metavar="KEY",
        help="the key for admin routes (default: any client key)",
    )
    a("--client-header-timeout-secs", type=float, default=d.client_header_timeout_secs, help="408 past it")
    a("--client-body-timeout-secs", type=float, default=d.client_body_timeout_secs, help="408 past it")
    a("--client-keepalive-timeout-secs", type=float, default=d.client_keepalive_timeout_secs)
    a("--max-client-connections", type=int, default=d.max_client_connections, help="503 past it")


EDGE_FIELDS = (
    "client_api_keys",
    "client_api_keys_file",
    "admin_api_key",
    "client_header_timeout_secs",
    "client_body_timeout_secs",
    "client_keepalive_timeout_secs",
    "max_client_connections",
)
_FIELDS = (
    "worker_urls",
    "host",
    "port",
    "policy",
    "intra_node_data_parallel_size",
    "api_key",
    "cache_threshold",
    "balance_abs_threshold",
    "balance_rel_threshold",
    "max_tree_size",
    "max_payload_size",
    "request_timeout_secs",
    "retry_max_retries",
    "health_check_interval_secs",
    "health_check_timeout_secs",
    "health_check_endpoint",
    "health_failure_threshold",
    "health_success_threshold",
    "prometheus_host",
    "prometheus_port",
    "log_level",
    *EDGE_FIELDS,
)


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    """The RouterConfig the flags describe; raises ConfigError naming the bad field."""
    program = ProgramSchedulingConfig.resolve(
        args.enable_program_scheduling, args.program_scheduling_config_json
    )
    data: dict[str, Any] = {name: getattr(args, name) for name in _FIELDS}
    data["program_scheduling"] = program
    return parse_config(RouterConfig, data, prefix="router arguments")


def _event_loop_runner() -> Callable[[Coroutine[Any, Any, None]], None]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        return asyncio.run

    def run(main: Coroutine[Any, Any, None]) -> None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main)

    return run


async def serve(config: RouterConfig) -> None:
    """Run until SIGINT/SIGTERM."""
    from progrouter.server.runner import start_router

    running = await start_router(config)
    log.info(
        "progrouter listening on %s (policy %s, %d worker(s), metrics %s, Program scheduling %s)",
        running.url,
        config.policy.value,
        len(config.worker_urls),
        running.metrics_url or "off",
        "on" if config.program_scheduling is not None else "off",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await running.stop()


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"progrouter serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        _event_loop_runner()(serve(config))
    except OSError as exc:
        print(f"progrouter serve: cannot listen: {exc}", file=sys.stderr)
        return 1
    return 0
