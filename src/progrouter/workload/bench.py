"""The A/B benchmark: the same trace through several routing arms, each on a cold fleet, side by side.

For every arm: start the engines (emulator processes, or the user's engines after their restart command),
start the router of the arm, scrape the engines' metrics, replay the trace through the router, scrape again
(and the router's metrics and diagnostics), stop everything. Figures come from `report.arm_figures`.

Arms (``ARMS``):
- ``native``: ``--policy consistent_hash``; the replay's ``x-session-id`` keys it (upstream's default setup);
- ``round_robin``: request-level round robin;
- ``program``: Program scheduling with the given config JSON;
- ``binding_only``: the same config with ``binding_only: true`` (Program affinity without admission/TTL);
- ``program_residency``: the same config with ``residency_aware: true``, the emulators publishing their KV
  events (``--kv-events-config``, IPC) and the router subscribed to them;
- ``oracle``: native on engines whose KV never runs out (the floor Program scheduling can approach);
- ``upstream``: the ``vllm-router`` PyPI package with ``--enable-program-scheduling`` and the same JSON.

With ``--api messages``, ``responses`` or ``chat-session`` the replay sends identity only in the harness's
headers, so the Program arms run with enable key ``auto`` unless the config names one.

Time compression: the emulator runs ``time_scale`` times faster than modelled time, the replay waits gaps
divided by it, and the router's time-valued config (intervals, timeouts, TTL caps and the cost-model
coefficients) is divided by it too, so the router reasons in the wall seconds it observes. Reported figures
are in modelled seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from rich.console import Console

from progrouter.config import AUTO_TOKEN_CAPACITY, ProgramSchedulingConfig
from progrouter.workload.apis.base import HEADER_IDENTITY_APIS
from progrouter.workload.arms import (
    ARMS,
    ArmSpec,
    EngineFleet,
    kv_events_engine_args,
    kv_events_router_args,
    oracle_blocks,
)
from progrouter.workload.facts import Fact, write_fact
from progrouter.workload.procs import Child, ProcessError, free_port, free_ports_from, run_shell, stop_all
from progrouter.workload.replay import ReplayOptions, replay
from progrouter.workload.report import ArmInputs, Sample, arm_figures, compare, parse_metrics, task_jct
from progrouter.workload.trace import Trace

#: Program-scheduling fields in seconds (divided by the time scale for the router).
TIME_FIELDS = (
    "metrics_interval_seconds",
    "queue_timeout_seconds",
    "force_resume_timeout_seconds",
    "paused_retention_ttl_seconds",
    "shared_prefix_freshness_warmup_seconds",
    "max_acting_ttl_seconds",
    "max_kv_retention_ttl_seconds",
    "weighed_ttl_max_seconds",
    "weighed_ttl_check_seconds",
)
COST_FIELDS = {
    "prefill_cost_model": (
        "intercept_seconds",
        "linear_seconds_per_1k_tokens",
        "quadratic_seconds_per_1k_tokens_squared",
    ),
    "decode_throughput_model": (
        "fixed_step_seconds",
        "batch_step_seconds_per_request",
        "context_step_seconds_per_token",
    ),
}
UPSTREAM_BINARY = "vllm-router"
ENABLE_KEY_FIELDS = frozenset({"enable_key", "program_scheduling_enable_key"})


@dataclass(frozen=True, slots=True)
class ExternalFleet:
    """Engines the user runs (e.g. real vLLM); ``restart_command`` runs before each arm for a cold start."""

    urls: tuple[str, ...]
    dp_size: int = 1
    time_scale: float = 1.0
    restart_command: str | None = None


@dataclass(frozen=True, slots=True)
class BenchPlan:
    trace: Trace
    arms: tuple[str, ...]
    fleet: EngineFleet | ExternalFleet
    program_config: dict[str, Any]
    report_dir: Path
    replay: ReplayOptions = field(default_factory=lambda: ReplayOptions(url=""))
    upstream_binary: str | None = None
    router_log_level: str = "warning"
    engine_base_port: int | None = None


def upstream_binary(explicit: str | None = None) -> str | None:
    """The ``vllm-router`` executable: the given path, else on PATH or beside this Python."""
    if explicit:
        return explicit
    found = shutil.which(UPSTREAM_BINARY)
    if found:
        return found
    beside = Path(sys.executable).parent / UPSTREAM_BINARY
    return str(beside) if beside.exists() else None


def scaled_program_config(config: dict[str, Any], time_scale: float) -> dict[str, Any]:
    """The router's config for a compressed run: every time-valued field divided by ``time_scale``."""
    full = ProgramSchedulingConfig.model_validate(config).to_json_dict()
    if time_scale == 1.0:
        return full
    for name in TIME_FIELDS:
        full[name] = full[name] / time_scale
    for group, names in COST_FIELDS.items():
        for name in names:
            full[group][name] = full[group][name] / time_scale
    ProgramSchedulingConfig.model_validate(full)  # still valid
    return full


ProgressFactory = Callable[[str, int], Callable[[Fact], None]]


async def _scrape(
    session: aiohttp.ClientSession, url: str, source: str = "", keep: Path | None = None
) -> list[Sample]:
    """The samples of ``url``/metrics (empty if it cannot be read); the raw text is kept in ``keep``."""
    try:
        async with session.get(f"{url}/metrics") as resp:
            if resp.status != 200:
                return []
            text = await resp.text()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return []
    if keep is not None:
        with open(keep, "a") as f:
            f.write(text)
    return parse_metrics(text, source)


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with session.get(url) as resp:
            if resp.status != 200:
                return None
            return orjson.loads(await resp.read())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


class Bench:
    def __init__(self, plan: BenchPlan, console: Console, progress: ProgressFactory | None = None) -> None:
        self.plan = plan
        self.console = console
        self.progress = progress
        self.time_scale = plan.fleet.time_scale
        # The same engine ports for every arm: the consistent-hash ring hashes worker URLs, so arms that hash
        # see the same placement and differ only in what they are meant to compare.
        engines = plan.fleet.engines if isinstance(plan.fleet, EngineFleet) else 0
        if plan.engine_base_port is not None:
            self.engine_ports = free_ports_from(plan.engine_base_port, engines)
        else:
            self.engine_ports = [free_port() for _ in range(engines)]
        self.event_ports: list[int] = []  # per engine, the KV event port of its Rank 0 (kv_events arms)

    def _dp_size(self) -> int:
        return self.plan.fleet.dp_size

    async def _start_engines(self, arm: ArmSpec, folder: Path) -> tuple[list[str], list[Child]]:
        fleet = self.plan.fleet
        if isinstance(fleet, ExternalFleet):
            if fleet.restart_command:
                await run_shell(fleet.restart_command, folder / "restart.log")
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
                for url in fleet.urls:
                    await _wait_url(session, f"{url}/health", 600.0)
            return list(fleet.urls), []
        blocks = oracle_blocks(self.plan.trace, fleet) if arm.unbounded_kv else fleet.num_blocks
        self.event_ports = [free_port_run(fleet.dp_size) for _ in self.engine_ports] if arm.kv_events else []
        urls, children = [], []
        try:
            for i, port in enumerate(self.engine_ports):
                extra = kv_events_engine_args(self.event_ports[i]) if arm.kv_events else ()
                argv = fleet.argv(port, blocks, extra)
                child = await Child.start(f"engine {i}", argv, folder / f"engine-{i}.log")
                children.append(child)
                urls.append(f"http://127.0.0.1:{port}")
            for url, child in zip(urls, children, strict=True):
                await child.wait_healthy(f"{url}/health")
        except BaseException:
            await stop_all(children)
            raise
        return urls, children

    def _router_argv(self, arm: ArmSpec, urls: Sequence[str], port: int, metrics_port: int) -> list[str]:
        dp = self._dp_size()
        if arm.upstream:
            binary = upstream_binary(self.plan.upstream_binary)
            if binary is None:
                raise ProcessError(
                    "the upstream arm needs the vllm-router executable (pip install vllm-router)"
                )
            argv = [binary]
        else:
            argv = [sys.executable, "-m", "progrouter", "serve", "--log-level", self.plan.router_log_level]
        argv += [
            "--worker-urls", *urls,
            "--host", "127.0.0.1", "--port", str(port),
            "--policy", arm.policy,
            "--intra-node-data-parallel-size", str(dp),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        ]  # fmt: skip
        if arm.policy == "kv_aware" and isinstance(self.plan.fleet, EngineFleet):
            argv += kv_events_router_args(urls, self.event_ports, self.plan.fleet)
        if arm.upstream and dp > 1:
            argv += ["--api-key", "progrouter-bench"]  # upstream insists on one with DP > 1; any value
        if arm.program:
            cfg = dict(self.plan.program_config)
            if self.plan.replay.api in HEADER_IDENTITY_APIS and not ENABLE_KEY_FIELDS & cfg.keys():
                cfg["enable_key"] = "auto"  # the harness shapes carry identity only in headers
            if arm.binding_only:
                cfg["binding_only"] = True
            if arm.upstream and cfg.get("token_capacity_per_dp_rank") == AUTO_TOKEN_CAPACITY:
                # "auto" is beyond the spec: upstream gets the size the emulators are started with
                fleet = self.plan.fleet
                cfg["token_capacity_per_dp_rank"] = (
                    fleet.capacity_tokens if isinstance(fleet, EngineFleet) else None
                )
            if arm.residency:
                assert isinstance(self.plan.fleet, EngineFleet)  # skip_reason: only emulators it starts
                events = zip(urls, self.event_ports, strict=True)
                cfg |= {
                    "residency_aware": True,
                    "kv_event_sources": {url: f"tcp://127.0.0.1:{base}" for url, base in events},
                    "kv_event_block_size": self.plan.fleet.block_size,
                }
            scaled = scaled_program_config(cfg, self.time_scale)
            argv += [
                "--enable-program-scheduling",
                "--program-scheduling-config-json",
                orjson.dumps(scaled).decode(),
            ]
        return argv

    async def run_arm(self, name: str) -> dict[str, Any]:
        arm = ARMS[name]
        folder = self.plan.report_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        urls, engines = await self._start_engines(arm, folder)
        children = list(engines)
        try:
            port, metrics_port = free_port(), free_port()
            router = await Child.start(
                f"{name} router", self._router_argv(arm, urls, port, metrics_port), folder / "router.log"
            )
            children.append(router)
            router_url = f"http://127.0.0.1:{port}"
            await router.wait_healthy(f"{router_url}/health")
            cpu_before = process_cpu_seconds(router.proc.pid)
            figures = await self._measure(arm, folder, urls, router_url, f"http://127.0.0.1:{metrics_port}")
            cpu = process_cpu_seconds(router.proc.pid) - cpu_before
            figures["router_cpu_seconds"] = cpu
            figures["router_cpu_ms_per_request"] = 1e3 * cpu / max(1, self.plan.trace.num_requests)
            (folder / "figures.json").write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2))
            return figures
        finally:
            await stop_all(children[::-1])

    async def _measure(
        self, arm: ArmSpec, folder: Path, engine_urls: Sequence[str], router_url: str, metrics_url: str
    ) -> dict[str, Any]:
        trace = self.plan.trace
        timeout = aiohttp.ClientTimeout(total=10.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            before = [
                s for u in engine_urls for s in await _scrape(session, u, u, folder / "engine-before.prom")
            ]
            sink = self.progress(arm.name, trace.num_requests) if self.progress else None
            with open(folder / "facts.jsonl", "wb") as f:

                def on_fact(fact: Fact) -> None:
                    write_fact(f, fact)
                    if sink is not None:
                        sink(fact)

                opts = replace(self.plan.replay, url=router_url, time_scale=self.time_scale)
                if arm.upstream and self._dp_size() > 1:
                    opts = replace(opts, headers={**opts.headers, "Authorization": "Bearer progrouter-bench"})
                result = await replay(trace, opts, on_fact)
            after = [
                s for u in engine_urls for s in await _scrape(session, u, u, folder / "engine-after.prom")
            ]
            router_samples = await _scrape(session, metrics_url, keep=folder / "router.prom")
            diagnostics = await _get_json(session, f"{router_url}/scheduling/diagnostics")
        if diagnostics is not None:
            (folder / "diagnostics.json").write_bytes(orjson.dumps(diagnostics, option=orjson.OPT_INDENT_2))
        planned = {t.task_id: t.num_requests for t in trace.tasks}
        figures = arm_figures(
            ArmInputs(result.facts, planned, before, after, router_samples, wall_seconds=result.wall_seconds)
        )
        figures["jct_per_task"] = task_jct(result.facts, planned)
        figures["router_metrics_scraped"] = bool(router_samples)
        (folder / "figures.json").write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2))
        return figures

    async def run(self) -> dict[str, Any]:
        self.plan.report_dir.mkdir(parents=True, exist_ok=True)
        arms: dict[str, dict[str, Any]] = {}
        skipped: dict[str, str] = {}
        for name in self.plan.arms:
            reason = self.skip_reason(name)
            if reason:
                skipped[name] = reason
                self.console.print(f"[yellow]skipping {name}[/yellow]: {reason}")
                continue
            self.console.print(f"[bold]arm {name}[/bold]: cold start")
            arms[name] = await self.run_arm(name)
        report = {
            "arms": arms,
            "comparison": compare(arms),
            "skipped": skipped,
            "program_config": self.plan.program_config,
            "router_program_config": scaled_program_config(self.plan.program_config, self.time_scale),
            "fleet": _fleet_json(self.plan.fleet, self.plan.trace),
            "trace": {
                "source": self.plan.trace.source,
                "tasks": len(self.plan.trace.tasks),
                "requests": self.plan.trace.num_requests,
                "meta": self.plan.trace.meta,
            },
        }
        (self.plan.report_dir / "report.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        return report

    def skip_reason(self, name: str) -> str | None:
        arm = ARMS[name]
        if arm.upstream and upstream_binary(self.plan.upstream_binary) is None:
            return "vllm-router is not installed (pip install vllm-router)"
        if arm.kv_events and isinstance(self.plan.fleet, ExternalFleet):
            return "needs the engines' KV event endpoints; the bench only knows those of engines it starts"
        if arm.unbounded_kv and isinstance(self.plan.fleet, ExternalFleet):
            return "needs engines with unbounded KV; the bench cannot resize engines it did not start"
        return None


def free_port_run(n: int) -> int:
    """A loopback port p with p .. p + n - 1 all free (Rank r of an engine publishes KV events on p + r)."""
    for _ in range(50):
        base = free_port()
        if base + n <= 65536 and free_ports_from(base, n) == list(range(base, base + n)):
            return base
    raise ProcessError(f"no run of {n} free loopback ports")


def process_cpu_seconds(pid: int | None) -> float:
    """User + system CPU of a running process (all its threads), from /proc; 0 where there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _fleet_json(fleet: EngineFleet | ExternalFleet, trace: Trace) -> dict[str, Any]:
    if isinstance(fleet, ExternalFleet):
        return {"external_urls": list(fleet.urls), "dp_size": fleet.dp_size, "time_scale": fleet.time_scale}
    return {
        "engines": fleet.engines,
        "dp_size": fleet.dp_size,
        "num_blocks_per_rank": fleet.num_blocks,
        "block_size": fleet.block_size,
        "capacity_tokens_per_rank": fleet.capacity_tokens,
        "oracle_num_blocks_per_rank": oracle_blocks(trace, fleet),
        "max_num_seqs": fleet.max_num_seqs,
        "time_scale": fleet.time_scale,
    }


async def _wait_url(session: aiohttp.ClientSession, url: str, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(url) as resp:
                if resp.status == 200:
                    return
        if loop.time() > deadline:
            raise ProcessError(f"{url} not healthy after {timeout:.0f} s")
        await asyncio.sleep(1.0)
