"""`progrouter epp`: the Envoy ext_proc endpoint picker, with `serve`'s flags, config file and environment.

``--host``/``--port`` are the gRPC (ext_proc) listener, ``--admin-port`` the HTTP listener of health,
readiness, liveness, diagnostics and the dashboard, ``--prometheus-port`` the ``/metrics`` listener. Flags
about the proxy itself (retries, circuit breaker, inbound limits, the client edge) are accepted and unused:
Envoy is the proxy. ``--print-envoy-bootstrap`` prints an Envoy bootstrap that asks this EPP, and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys

from pydantic import BaseModel, ConfigDict, Field

from progrouter.config import ConfigError, Policy, RouterConfig, parse_config, setting
from progrouter.config_cli import add_model_arguments
from progrouter.server import cli as serve_cli

log = logging.getLogger("progrouter.epp")
DEFAULT_ADMIN_PORT = 9003
DEFAULT_ENVOY_PORT = 8081


class EppFlags(BaseModel):
    """The endpoint picker's own flags, besides `serve`'s settings (which it shares)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    admin_port: int = Field(
        default=DEFAULT_ADMIN_PORT,
        ge=0,
        le=65535,
        description="HTTP port of /health, /readiness, /liveness, /scheduling/diagnostics and /dashboard "
        "(0: any free port)",
        json_schema_extra=setting(group="endpoint picker"),
    )
    print_envoy_bootstrap: bool = Field(
        default=False, description="print an Envoy bootstrap (JSON) whose listener asks this EPP, then exit"
    )
    envoy_port: int = Field(
        default=DEFAULT_ENVOY_PORT, ge=1, le=65535, description="the printed bootstrap's listener port"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    serve_cli.add_arguments(parser)
    parser.description = (
        "An Envoy ext_proc endpoint picker (Gateway API Inference Extension) around the Program scheduler;\n"
        "--host/--port are its gRPC listener. Settings as in `progrouter serve` (docs/guides/envoy-epp.md)."
    )
    add_model_arguments(parser, EppFlags)


def epp_flags(args: argparse.Namespace) -> EppFlags:
    """The endpoint picker's own flags, taken out of ``args`` (what is left are `serve`'s settings)."""
    given = {name: args.__dict__.pop(name) for name in EppFlags.model_fields if name in args.__dict__}
    return parse_config(EppFlags, given, prefix="endpoint picker flags")


def host_port(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as Envoy's socket address wants it."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def bootstrap_text(config: RouterConfig, envoy_port: int) -> str:
    from progrouter.epp.bootstrap import epp_bootstrap

    program = config.program_scheduling
    queue_timeout = program.queue_timeout_seconds if program is not None else 0.0
    bootstrap = epp_bootstrap(
        (config.host, config.port),
        queue_timeout_seconds=queue_timeout,
        request_timeout_seconds=config.request_timeout_secs,
        max_request_bytes=config.max_payload_size,
        host="0.0.0.0",
        port=envoy_port,
        response_body=config.epp_response_body,
        standby=[host_port(address) for address in config.epp_standby],
    )
    return json.dumps(bootstrap, indent=2)


def kv_events_refusal(config: RouterConfig) -> str | None:
    """What this shell cannot run yet: the KV event subscribers start only with `serve`, so kv_aware and
    residency-aware scheduling would silently fall back to load-only scoring here."""
    if config.policy is Policy.KV_AWARE:
        return "--policy kv_aware is not supported by the EPP yet (use progrouter serve)"
    if config.program_scheduling is not None and config.program_scheduling.residency_aware:
        return "residency_aware Program scheduling is not supported by the EPP yet (use progrouter serve)"
    return None


async def serve_epp(config: RouterConfig, admin_port: int) -> int:
    """Run until SIGINT/SIGTERM (exit 1 when no configured worker ever answered its health endpoint)."""
    from progrouter.epp.service import start_epp

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    running = await start_epp(config, admin_port=admin_port, workers_start_healthy=not config.worker_urls)
    state = running.state
    log.info(
        "progrouter epp: ext_proc on %s, admin %s, metrics %s, Program scheduling %s",
        running.grpc_address,
        running.admin_url,
        running.metrics_url or "off",
        "on" if config.program_scheduling is not None else "off",
    )
    try:
        if config.worker_urls:
            assert state.checker is not None
            answered = await state.checker.wait_for_answer(
                state.worker_urls, config.worker_startup_timeout_secs, config.worker_startup_check_interval
            )
            state.workers_answered(answered)
            if not answered:
                log.error(
                    "no worker answered %s within %gs",
                    config.health_check_endpoint,
                    config.worker_startup_timeout_secs,
                )
                return 1
        await stop.wait()
        state.draining = True  # not ready; requests still waiting in the RequestPool get a retryable 503
        if state.gate is not None:
            state.gate.shed_waiting()
    finally:
        await running.stop(config.drain_timeout_secs)
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        flags = epp_flags(args)
    except ConfigError as exc:
        print(f"progrouter epp: {exc}", file=sys.stderr)
        return 2
    admin_port, printing, envoy_port = flags.admin_port, flags.print_envoy_bootstrap, flags.envoy_port
    refused = serve_cli.refuse_unsupported(args)
    if refused is not None:
        print(f"progrouter epp: {refused}", file=sys.stderr)
        return 2
    try:
        config = serve_cli.config_from_args(args)
    except ConfigError as exc:
        print(f"progrouter epp: {exc}", file=sys.stderr)
        return 2
    refused = kv_events_refusal(config)
    if refused is not None:
        print(f"progrouter epp: {refused}", file=sys.stderr)
        return 2
    if printing:
        print(bootstrap_text(config, envoy_port))
        return 0
    from progrouter.server.telemetry.setup import setup_telemetry

    try:
        setup_telemetry(config)
    except (OSError, ConfigError) as exc:
        print(f"progrouter epp: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(serve_epp(config, admin_port))
    except OSError as exc:
        print(f"progrouter epp: cannot listen: {exc}", file=sys.stderr)
        return 1
