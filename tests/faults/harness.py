"""The fault rig (emulator subprocesses behind an in-process router) and the invariants every scenario checks.

After the load of a scenario, ``check_invariants`` asserts, with bounded polling for "eventually":
1. lost == 0 (every request got a whole answer or an error, within its budget);
2. no request reached an engine after bytes of its answer had reached the client (engine tap vs. client);
3. the ledger's charged tokens, the RequestPool, in-flight counts and the ``vllm_router_agent_aware_*``
   gauges return to zero (``/scheduling/diagnostics`` and the router's Prometheus scrape);
4. no Program stayed paused with waiting requests past its force-resume deadline plus one tick, on a Rank
   whose vLLM waiting gate is open (sampled throughout the load by ``ForceResumeWatch``);
5. ``/health`` and the diagnostics' Ranks agree with which engines are up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from integration.helpers import wait_until
from progrouter.server.runner import RunningRouter
from support.agents import AgentPlan, Tally, run_agents
from support.factories import RouterFactory
from support.processes import EngineProcess
from support.tapped_engine import read_arrivals

GAUGE_PREFIX = "vllm_router_agent_aware_"
ENGINE_FLAGS = [
    "--model-name", "emu", "--num-blocks", "188", "--block-size", "16", "--max-model-len", "3000",
    "--time-scale", "10",
]  # fmt: skip
PROGRAM = {
    "token_capacity_per_dp_rank": 1200,  # about two of the agents' Programs per Rank: the pool is used
    "metrics_interval_seconds": 0.2,
    "max_acting_ttl_seconds": 0.5,
    "force_resume_timeout_seconds": 2.0,
    "queue_timeout_seconds": 10.0,
}
ROUTER = {
    "request_timeout_secs": 4.0,
    "retry_max_retries": 3,
    "health_check_interval_secs": 0.2,
    "health_check_timeout_secs": 0.5,
    "health_failure_threshold": 1,
    "health_success_threshold": 1,
    "prometheus_port": 0,
    # A killed worker can fail ten requests before the health check notices, which opens its circuit; an
    # open circuit keeps its Ranks out of Program placement for this long (upstream's rule), so the end
    # state check_invariants waits for (every worker back in the scheduler) is reached within its window.
    "cb_timeout_duration_secs": 2.0,
}
SLACK = 1.0  # scheduling slack on a loaded 2-core machine, on top of every bound


def client_budget(program: dict[str, Any], router: dict[str, Any]) -> float:
    """The longest a request may take: its pool wait plus every attempt's timeout, plus slack."""
    attempts = int(router["retry_max_retries"]) + 1
    return float(program["queue_timeout_seconds"]) + attempts * float(router["request_timeout_secs"])


@dataclass
class Rig:
    engines: list[EngineProcess]
    url: str
    metrics_url: str
    session: aiohttp.ClientSession
    program: dict[str, Any]
    router: dict[str, Any]

    async def get_json(self, path: str) -> tuple[int, Any]:
        async with self.session.get(self.url + path) as r:
            return r.status, await r.json(content_type=None)

    async def diagnostics(self) -> dict[str, Any]:
        status, body = await self.get_json("/scheduling/diagnostics")
        assert status == 200, body
        return dict(body)

    async def gauges(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every gauge sample of the router's scrape: Program gauges and any in-flight gauge."""
        async with self.session.get(self.metrics_url) as r:
            text = await r.text()
        out = {}
        for family in text_string_to_metric_families(text):
            if family.type != "gauge":
                continue
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    async def engine_post(self, engine: EngineProcess, path: str, body: dict[str, Any]) -> None:
        async with self.session.post(engine.url + path, json=body) as r:
            assert r.status == 200, await r.text()

    async def fault(self, engine: EngineProcess, **body: Any) -> None:
        """The emulator's ``POST /admin/fault`` (mode, fail_rate, slow_factor), sent to the engine itself."""
        await self.engine_post(engine, "/admin/fault", {"rank": None, **body})


@dataclass
class ForceResumeWatch:
    """Samples the diagnostics during the load; records Programs left paused past their force deadline."""

    rig: Rig
    violations: list[dict[str, Any]] = field(default_factory=list)
    samples: int = 0
    queued_seen: int = 0  # samples of a paused Program with waiting requests (the check is not vacuous)

    async def run(self) -> None:
        tick = self.rig.program["metrics_interval_seconds"]
        while True:
            with contextlib.suppress(aiohttp.ClientError, AssertionError):
                d = await self.rig.diagnostics()
                self.samples += 1
                for rank in d["ranks"]:
                    if _gated(rank, self.rig.program) or rank.get("router_forced_past_limits"):
                        # the vLLM waiting gate blocks even a forced resume (as upstream), and a Rank already
                        # holding one Program forced past its limits takes the next overdue one only when
                        # that one leaves (the bound on forced resumes, docs/scheduler.md)
                        continue
                    for p in rank["programs"]:
                        timeout = p["force_resume_timeout_seconds"]
                        if p["state"] != "paused" or not p["waiting_requests"] or timeout is None:
                            continue
                        self.queued_seen += 1
                        if (p["queued_seconds"] or 0.0) > timeout + tick + SLACK:
                            self.violations.append({k: p[k] for k in ("program", "queued_seconds")})
            await asyncio.sleep(0.1)


def _gated(rank: dict[str, Any], program: dict[str, Any]) -> bool:
    """Whether the Rank's observed vLLM waiting count closes its waiting gate."""
    threshold = int(program.get("admission_waiting_request_threshold", 1))
    waiting = rank["vllm_waiting_requests"]
    return threshold > 0 and waiting is not None and waiting >= threshold


@contextlib.asynccontextmanager
async def watching(rig: Rig) -> AsyncIterator[ForceResumeWatch]:
    watch = ForceResumeWatch(rig)
    task = asyncio.create_task(watch.run())
    try:
        yield watch
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def redispatched_after_bytes(tally: Tally, tap_logs: list[Path]) -> list[str]:
    """Request ids that reached an engine after the client had received bytes of their answer."""
    first_byte = {r.rid: r.first_byte for r in tally.records if r.first_byte is not None}
    late = set()
    for path in tap_logs:
        for arrival in read_arrivals(path):
            t = first_byte.get(arrival["id"])
            if t is not None and arrival["t"] > t:
                late.add(arrival["id"])
    return sorted(late)


def _idle(d: dict[str, Any]) -> list[str]:
    """What in a diagnostics snapshot is not back to zero (empty when idle)."""
    busy = []
    if d["retained_requests"]:
        busy.append(f"retained_requests={d['retained_requests']}")
    for rank in d["ranks"]:
        for key in (
            "router_ledger_tokens",
            "active_acting_private_tokens",
            "router_active_programs",
            "router_in_flight_requests",
            "router_queued_programs",
            "router_queued_requests",
        ):
            if rank[key]:
                busy.append(f"{rank['target_id']} {key}={rank[key]}")
        busy += [
            f"{p['program']} charged={p['charged_tokens']}" for p in rank["programs"] if p["charged_tokens"]
        ]
    return busy


def _busy_gauges(gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> list[str]:
    return [
        f"{name}{dict(labels)}={value}"
        for (name, labels), value in gauges.items()
        if value
        and (
            name.startswith(GAUGE_PREFIX + "rank_queue_size")
            or name.startswith(GAUGE_PREFIX + "rank_active_programs")
            or "in_flight" in name
        )
    ]


async def check_invariants(rig: Rig, tally: Tally, watch: ForceResumeWatch) -> None:
    lost = tally.lost()
    assert not lost, f"{len(lost)} lost: " + "; ".join(f"{r.rid} {r.detail}" for r in lost[:5])
    late = redispatched_after_bytes(tally, [e.tap_log for e in rig.engines])
    assert not late, f"dispatched again after bytes reached the client: {late}"
    assert not watch.violations, f"paused past the force-resume deadline: {watch.violations[:5]}"
    assert watch.samples > 0
    d = await wait_until(rig.diagnostics, lambda d: not _idle(d), timeout=15.0)
    assert not _idle(d)
    await wait_until(rig.gauges, lambda g: not _busy_gauges(g), timeout=5.0)
    up = {e.url for e in rig.engines}

    async def views() -> tuple[int, set[str]]:
        status, _ = await rig.get_json("/health")
        return status, {r["base_url"] for r in (await rig.diagnostics())["ranks"]}

    await wait_until(views, lambda v: v == (200, up), timeout=10.0)


async def start_rig(
    tmp_path: Path,
    make_router: RouterFactory,
    session: aiohttp.ClientSession,
    *,
    engines: int = 2,
    data_parallel: int = 1,
    program: dict[str, Any] | None = None,
    **router: Any,
) -> tuple[Rig, RunningRouter]:
    flags = [*ENGINE_FLAGS, "--data-parallel-size", str(data_parallel)]
    procs = [EngineProcess(flags, tmp_path / f"tap-{i}.jsonl") for i in range(engines)]
    program = {**PROGRAM, **(program or {})}
    router = {**ROUTER, "intra_node_data_parallel_size": data_parallel, **router}
    try:
        await asyncio.gather(*(p.start() for p in procs))
        running = await make_router([p.url for p in procs], program, **router)
    except BaseException:
        for proc in procs:
            await proc.stop()
        raise
    assert running.metrics_url is not None
    return Rig(procs, running.url, running.metrics_url, session, program, router), running


def mixed_agents(programs: int = 6, native: int = 2, **plan: Any) -> list[AgentPlan]:
    """Program agents (streaming first or not, alternately) and native agents with the same turn shape."""
    fields = {"turns": 6, "max_tokens": 24, "think_seconds": 0.1, **plan}
    agents = [AgentPlan(f"p{i}-agent", first_stream=i % 2 == 0, **fields) for i in range(programs)]
    agents += [
        AgentPlan(f"n{i}-native", program=False, first_stream=i % 2 == 1, **fields) for i in range(native)
    ]
    return agents


async def drive(
    rig: Rig,
    plans: list[AgentPlan],
    fault: Callable[[Tally], Awaitable[None]],
    report: Callable[[Tally], None],
) -> tuple[Tally, ForceResumeWatch]:
    """Run the agents; inject ``fault`` (it sees the live tally) while they run; return how each ended.

    The tally is reported even when the fault step fails, so the scenario table always has its row."""
    budget = client_budget(rig.program, rig.router) + SLACK
    async with watching(rig) as watch:
        tally = Tally()
        load = asyncio.create_task(run_agents(rig.url, plans, budget, tally))
        try:
            await fault(tally)
        finally:
            await load
            report(tally)
    return tally, watch
