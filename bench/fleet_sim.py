"""Fleet-size simulation: Ranks of a GPU engine profile, Claude-Code-shaped agents at full token scale, one
arm after another on the same trace, for a bounded stretch of modelled time.

``--agents`` sessions run at once (``max_concurrent_tasks``): when one ends the next starts, so the offered
load stays at that many agents for the whole run. The trace has ``--agents`` × (1 + ``--reserve``) sessions;
the run stops at ``--hours`` of modelled time, and every figure covers what happened until then (requests
that completed; JCT over the sessions that completed). KV blocks are ``--block-size`` tokens (default 256:
see docs/simulator.md for what a coarser block changes). Prints, per arm: request latency and session JCT,
token cache hit, prefill GPU-seconds spent and saved (the profile's prefill model applied to each completed
request's uncached and cached tokens), queue wait in the router, preemptions, KV utilisation, Programs per
Rank, and the wall time; writes a PNG of Programs per Rank over time and a JSON of the figures.

Target (issue 13): one modelled hour of 16 Ranks × 2,000 agents in under 60 s of wall time. The trace is
generated once; then each arm runs in its own forked process (``--jobs`` at once, default one per core), which
inherits the trace instead of copying it. Every figure is the same as one arm after another in one process.

    .venv/bin/python bench/fleet_sim.py --profile h200-llama-8b --ranks 16 --agents 2000 --hours 1 \\
        --out fleet-report

By default the bench runs the two arms its report compares (``DEFAULT_ARMS``): native routing and Program
scheduling as the README deploys it (``capacity``); queue wait and Programs per Rank mean something only
beside a Program arm.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from progrouter.engine.profiles import BUILTIN, EngineProfile, load_profile, with_cost_models
from progrouter.sim.arms import Hint, SimArm, parse_hint, standard_arm, variant_arm
from progrouter.sim.ranks import FleetSpec
from progrouter.sim.requests import SimRequest
from progrouter.sim.routers import ProgramRouter
from progrouter.sim.simulation import Simulation
from progrouter.workload.agentic import AgenticWorkload, generate_agentic
from progrouter.workload.facts import Fact
from progrouter.workload.report import prefill_gpu_seconds
from progrouter.workload.trace import Trace

#: The arms: native consistent hashing, the spec's default Program config, Program scheduling told the Ranks'
#: KV size with the global queue (the README's first deployment), and native on unbounded KV.
ARM_NAMES = ("native", "program", "capacity", "oracle")
DEFAULT_ARMS = "native,capacity"
SAMPLE_SECONDS = 10.0


def build_trace(agents: int, seed: int, reserve: float, fleet: FleetSpec) -> Trace:
    """``agents`` × (1 + ``reserve``) agentic sessions; contexts capped at 80% of a Rank's KV (compaction).

    The trace (~90 million block ids at 2,000 agents) holds no reference cycles and lives all run, so the
    cyclic garbage collector is off while it is built and it is frozen afterwards: otherwise every full
    collection, during generation and in every arm, walks all of it again (a third of the generation time)."""
    cap = min(AgenticWorkload().max_context_tokens, int(0.8 * fleet.capacity_tokens))
    tasks = int(agents * (1 + reserve))
    gc.disable()
    try:
        trace = generate_agentic(
            AgenticWorkload(tasks=tasks, seed=seed, block_size=fleet.block_size, max_context_tokens=cap)
        )
    finally:
        gc.enable()
    gc.freeze()
    return trace


TraceBuilder = Callable[[int, int, float, FleetSpec], Trace]


def build_arms(
    names: list[str],
    profile: EngineProfile,
    fleet: FleetSpec,
    agents: int,
    variants: dict[str, dict[str, Any]],
    hints: dict[str, Hint] | None = None,
) -> list[SimArm]:
    """The named arms, then each ``--variant``: the spec's default config with the profile's cost models, the
    capacity arm's pool bound and the variant's fields on top (``"token_capacity_per_dp_rank": "auto"`` is
    each Rank's KV tokens, as its engine reports them), its agents sending ``hints[name]`` as
    ``kv_retention_ttl_seconds`` if given."""
    base = with_cost_models({}, profile.prefill_cost_model, profile.decode_throughput_model)
    capacity = {
        "token_capacity_per_dp_rank": fleet.capacity_tokens,
        "global_queue": True,
        "max_pooled_requests": max(1024, 8 * agents),  # never the limit here: this measures scheduling
    }
    arms = []
    for name in names:
        if name == "capacity":
            arms.append(variant_arm(name, base, capacity))
        else:
            arms.append(standard_arm(name, base))
    for name, overrides in variants.items():
        pool = {"max_pooled_requests": capacity["max_pooled_requests"]}
        arms.append(variant_arm(name, base, {**pool, **overrides}, hint=(hints or {}).get(name)))
    return arms


def parse_variant_hints(texts: list[str], variants: dict[str, dict[str, Any]]) -> dict[str, Hint]:
    """``NAME=HINT`` pairs for variants (``progrouter simulate``'s hints, ``sim.arms.parse_hint``)."""
    hints: dict[str, Hint] = {}
    for text in texts:
        name, sep, raw = text.partition("=")
        if not sep or name not in variants or name in hints:
            raise SystemExit(f"--variant-hint wants NAME=HINT for a --variant given once, not {text!r}")
        try:
            hints[name] = parse_hint(raw)
        except ValueError as error:
            raise SystemExit(f"--variant-hint {name}: {error}") from None
    return hints


def parse_variants(texts: list[str]) -> dict[str, dict[str, Any]]:
    """``NAME=JSON`` pairs; a name may not repeat or shadow a standard arm."""
    variants: dict[str, dict[str, Any]] = {}
    for text in texts:
        name, sep, raw = text.partition("=")
        if not sep or not name or name in ARM_NAMES or name in variants:
            raise SystemExit(f"--variant wants a new NAME=JSON, not {text!r}")
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise SystemExit(f"--variant {name}: the JSON must be an object")
        variants[name] = data
    return variants


@dataclass(slots=True)
class Samples:
    """Every SAMPLE_SECONDS of modelled time: KV usage and the Programs with a request on each Rank."""

    times: list[float] = field(default_factory=list)
    kv: list[list[float]] = field(default_factory=list)
    programs: list[list[int]] = field(default_factory=list)


def sample_every(sim: Simulation, until: float, since: float = 0.0) -> Samples:
    """Schedule the samples on the simulation's clock, from ``since`` up to ``until``."""
    samples = Samples()

    def sample(_: object) -> None:
        samples.times.append(sim.clock.now)
        samples.kv.append([r.observation().kv_cache_usage for r in sim.ranks])
        samples.programs.append(sim.programs_per_rank())
        if sim.clock.now + SAMPLE_SECONDS <= until:
            sim.clock.at(sim.clock.now + SAMPLE_SECONDS, sample)

    sim.clock.at(since, sample)
    return samples


@dataclass(slots=True)
class Baseline:
    """The run's cumulative counters at the start of the measured window (all zero without a warm-up)."""

    preemptions: int = 0
    transitions: int = 0


def baseline_at(sim: Simulation, since: float) -> Baseline:
    """Read the counters that only accumulate (preemptions, scheduler transitions) at ``since``, so the
    figures cover the measured window alone."""
    base = Baseline()
    if since <= 0.0:
        return base

    def read(_: object) -> None:
        base.preemptions = sum(r.core.stats.num_preemptions for r in sim.ranks)
        router = sim.router
        base.transitions = len(router.observer.transitions) if isinstance(router, ProgramRouter) else 0

    sim.clock.at(since, read)
    return base


def record_sent(sim: Simulation) -> list[Fact]:
    """Every request the agents send, as its fact (the simulator fills it in when the request ends)."""
    sent: list[Fact] = []
    submit = sim.router.submit

    def recording(now: float, request: SimRequest) -> None:
        sent.append(request.fact)
        submit(now, request)

    sim.router.submit = recording  # type: ignore[method-assign]
    return sent


def censored_latency(sim: Simulation, sent: list[Fact], until: float, since: float = 0.0) -> float | None:
    """Mean request latency counting the requests still open at the horizon (queued in the router or in an
    engine) at ``until`` − sent: a config that starves agents cannot look fast by never finishing them.
    Only requests sent at or after ``since`` count."""
    done = {id(f) for f in sim.facts}
    latencies = [f.finished_at - f.started_at for f in sim.facts if f.ok and f.started_at >= since]
    latencies += [until - f.started_at for f in sent if id(f) not in done and f.started_at >= since]
    return statistics.fmean(latencies) if latencies else None


def dist(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None}
    return {
        "mean": statistics.fmean(values),
        "p50": float(np.median(values)),
        "p90": float(np.percentile(values, 90)),
    }


def summarize(
    sim: Simulation,
    samples: Samples,
    profile: EngineProfile,
    wall: float,
    since: float = 0.0,
    base: Baseline | None = None,
) -> dict[str, Any]:
    """The arm's figures over the requests sent at or after ``since`` (and the sessions started then)."""
    base = base or Baseline()
    facts = [f for f in sim.facts if f.started_at >= since]
    ok = [f for f in facts if f.ok and f.prompt_tokens is not None]
    model = profile.prefill_cost_model
    spent = prefill_gpu_seconds(ok, model)
    saved = prefill_gpu_seconds([replace(f, cached_tokens=None) for f in ok], model) - spent  # vs no hits
    prompt = sum(f.prompt_tokens or 0 for f in ok)
    cached = sum(f.cached_tokens or 0 for f in ok)
    e2e = [f.finished_at - f.started_at for f in ok]
    wait = [f.headers_at - f.started_at for f in ok if f.headers_at is not None]
    done_requests = Counter(f.task_id for f in ok)
    planned = {t.task_id: t.num_requests for t in sim.trace.tasks}
    last = {f.task_id: f.finished_at for f in ok}
    start = sim.agents.task_start
    jct = [last[t] - start[t] for t, n in done_requests.items() if n == planned[t] and start[t] >= since]
    kv = [u for row in samples.kv for u in row]
    programs = [n for row in samples.programs for n in row]
    return {
        "arm": sim.arm.name,
        "requests_completed": len(ok),
        "errors": sum(f.status == "error" for f in facts),
        "sessions_completed": len(jct),
        "request_seconds": dist(e2e),
        "jct_seconds": dist(jct),
        "token_hit": cached / prompt if prompt else None,
        "prefill_gpu_seconds_spent": spent,
        "prefill_gpu_seconds_saved": saved,
        "queue_wait_seconds": dist(wait),
        "preemptions": sum(r.core.stats.num_preemptions for r in sim.ranks) - base.preemptions,
        "kv_utilisation_mean": statistics.fmean(kv) if kv else None,
        "programs_per_rank": {"mean": statistics.fmean(programs) if programs else None,
                              "max": max(programs, default=0)},
        "transitions": transitions(sim, base.transitions),
        "events": sim.clock.events_run,
        "wall_seconds": wall,
    }  # fmt: skip


#: The Program scheduler's transitions worth a column: forced and cross-Rank resumes, TTL pauses.
TRANSITIONS = ("force_resume", "cross_rank_resume", "ttl_expired", "capacity_repair")


def transitions(sim: Simulation, skip: int = 0) -> dict[str, int]:
    """How often each of ``TRANSITIONS`` happened, all Ranks together (zeros for native arms), after the
    first ``skip`` transitions (those of the warm-up)."""
    router = sim.router
    counts = (
        Counter(r for _, r in router.observer.transitions[skip:]) if isinstance(router, ProgramRouter) else {}
    )
    return {name: counts.get(name, 0) for name in TRANSITIONS}


def fmt(v: Any, digits: int = 3) -> str:
    return "-" if v is None else (f"{v:.{digits}g}" if isinstance(v, float) else str(v))


def print_table(rows: list[dict[str, Any]]) -> None:
    cols: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
        ("arm", lambda r: r["arm"]),
        ("req done", lambda r: r["requests_completed"]),
        ("sess done", lambda r: r["sessions_completed"]),
        ("req mean s", lambda r: r["request_seconds"]["mean"]),
        ("req p50", lambda r: r["request_seconds"]["p50"]),
        ("req p90", lambda r: r["request_seconds"]["p90"]),
        ("JCT mean s", lambda r: r["jct_seconds"]["mean"]),
        ("JCT p50", lambda r: r["jct_seconds"]["p50"]),
        ("JCT p90", lambda r: r["jct_seconds"]["p90"]),
        ("hit", lambda r: r["token_hit"]),
        ("prefill s spent", lambda r: r["prefill_gpu_seconds_spent"]),
        ("saved", lambda r: r["prefill_gpu_seconds_saved"]),
        ("queue s", lambda r: r["queue_wait_seconds"]["mean"]),
        ("preempt", lambda r: r["preemptions"]),
        ("KV util", lambda r: r["kv_utilisation_mean"]),
        ("Progs/Rank", lambda r: r["programs_per_rank"]["mean"]),
        ("wall s", lambda r: r["wall_seconds"]),
    ]
    print(" | ".join(name for name, _ in cols))
    for row in rows:
        print(" | ".join(fmt(get(row)) for _, get in cols))


def plot(samplers: dict[str, Samples], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(samplers), 1, figsize=(9, 2.4 * len(samplers)), sharex=True, squeeze=False)
    for ax, (name, s) in zip(axes[:, 0], samplers.items(), strict=True):
        t = np.array(s.times) / 60.0
        data = np.array(s.programs, dtype=float)
        ax.plot(t, data, linewidth=0.6, alpha=0.6)
        ax.plot(t, data.mean(axis=1), color="black", linewidth=1.5, label="mean")
        ax.set_ylabel("Programs")
        ax.set_title(f"{name}: Programs with a request on each Rank", fontsize=9)
    axes[-1, 0].set_xlabel("modelled minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fleet_spec(
    profile: EngineProfile, ranks: int, block_size: int, max_num_seqs: int, *, plain_runs: bool = True
) -> FleetSpec:
    """The fleet a profile gives: its KV in blocks of ``block_size``, its cost models, 8,192-token chunks."""
    return FleetSpec(
        ranks=ranks,
        num_blocks=profile.num_blocks(block_size),
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=8192,
        prefill_cost_model=profile.prefill_cost_model,
        decode_throughput_model=profile.decode_throughput_model,
        plain_runs=plain_runs,
    )


def main(build: TraceBuilder = build_trace) -> None:
    """The bench; ``build`` makes each point's trace (bench/even_placement.py passes its own)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="h200-llama-8b", help=f"{', '.join(BUILTIN)} or a calibration.json")
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--agents", type=int, default=2000, help="concurrent sessions")
    ap.add_argument("--reserve", type=float, default=0.5, help="extra sessions, as a share of --agents")
    ap.add_argument("--hours", type=float, default=1.0, help="modelled time measured")
    ap.add_argument(
        "--warmup-hours",
        type=float,
        default=0.0,
        help="modelled time run first and left out of every figure (steady state: windows filled, the "
        "synchronised start gone); only requests and sessions that start after it count",
    )
    ap.add_argument("--block-size", type=int, default=256, help="tokens per KV block (trace and engine)")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--arms", default=DEFAULT_ARMS, help=f"comma-separated from {', '.join(ARM_NAMES)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-plain-runs", action="store_true", help="step one by one (same results, slower)")
    ap.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="arms run at once, each in its own process"
    )
    ap.add_argument(
        "--agents-per-rank", default=None, help="a load sweep, e.g. 2,4,8 (instead of --agents; with --seeds)"
    )
    ap.add_argument("--seeds", default="0,1", help="the sweep's seeds")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help='another Program arm: the spec default + JSON (\'cap={"token_capacity_per_dp_rank": "auto"}\')',
    )
    ap.add_argument(
        "--variant-hint",
        action="append",
        default=[],
        metavar="NAME=HINT",
        help="the agents of variant NAME send kv_retention_ttl_seconds: SECONDS, next-gap (the coming tool "
        "call's length, known in advance), next-gap:MAX (that, only for tool calls up to MAX seconds) or "
        "short:MAX (MAX for tool calls up to MAX seconds, else 0)",
    )
    ap.add_argument("--out", type=Path, default=None, help="folder for figures.json and programs.png")
    args = ap.parse_args()

    profile = load_profile(args.profile)
    fleet = fleet_spec(
        profile, args.ranks, args.block_size, args.max_num_seqs, plain_runs=not args.no_plain_runs
    )
    names = [a.strip() for a in args.arms.split(",") if a.strip()]
    if args.agents_per_rank:
        sweep(args, profile, fleet, names, build)
        return
    rows, samplers = run_point(args, profile, fleet, names, args.agents, args.seed, build)
    print_table(rows)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "figures.json").write_text(json.dumps(rows, indent=2) + "\n")
        plot(samplers, args.out / "programs.png")
        print(f"figures: {args.out / 'figures.json'}, {args.out / 'programs.png'}")


def run_point(
    args: argparse.Namespace,
    profile: EngineProfile,
    fleet: FleetSpec,
    names: list[str],
    agents: int,
    seed: int,
    build: TraceBuilder = build_trace,
) -> tuple[list[dict[str, Any]], dict[str, Samples]]:
    """Every arm on one trace of ``agents`` concurrent sessions."""
    started, cpu, children = time.perf_counter(), time.process_time(), children_cpu()
    trace = build(agents, seed, args.reserve, fleet)
    print(
        f"trace: {len(trace.tasks)} sessions, {trace.num_requests} requests, generated in "
        f"{time.perf_counter() - started:.1f} wall s, {time.process_time() - cpu:.1f} CPU s; fleet: "
        f"{fleet.ranks} Ranks × {fleet.capacity_tokens:,} KV tokens ({profile.name}, blocks of "
        f"{fleet.block_size}); {agents} agents; {args.hours:g} h; seed {seed}",
        flush=True,
    )
    since = args.warmup_hours * 3600.0
    until = since + args.hours * 3600.0
    variants = parse_variants(args.variant)
    arms = build_arms(
        names, profile, fleet, agents, variants, parse_variant_hints(args.variant_hint, variants)
    )

    def run_arm(index: int) -> tuple[dict[str, Any], Samples]:
        arm = arms[index]
        started, cpu = time.perf_counter(), time.process_time()
        sim = Simulation(trace, fleet, arm, max_concurrent_tasks=agents, until=until)
        samples = sample_every(sim, until, since)
        base = baseline_at(sim, since)
        sent = record_sent(sim)
        sim.advance()
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        row = summarize(sim, samples, profile, wall, since, base)
        row["request_seconds_censored"] = censored_latency(sim, sent, until, since)
        row["trace_exhausted"] = len(sim.agents.task_start) == len(trace.tasks)
        row["jct_little_seconds"] = little_jct(agents, until - since, row["requests_completed"], trace)
        row["cpu_seconds"] = cpu
        print(
            f"  {arm.name}: {until:,.0f} modelled s in {wall:.1f} wall s, {cpu:.1f} CPU s "
            f"({sim.clock.events_run:,} events)"
            + ("; every session of the trace started: raise --reserve" if row["trace_exhausted"] else ""),
            flush=True,
        )
        return row, samples

    results = in_processes(len(arms), run_arm, args.jobs)
    cpu = time.process_time() - cpu + children_cpu() - children
    print(f"  trace and arms: {time.perf_counter() - started:.1f} wall s, {cpu:.1f} CPU s", flush=True)
    return [row for row, _ in results], {row["arm"]: samples for row, samples in results}


def little_jct(agents: int, window: float, requests_completed: int, trace: Trace) -> float | None:
    """Mean session JCT by Little's law: ``agents`` sessions are always running (an ended one is replaced at
    once), so JCT = agents / session throughput, and session throughput = request throughput / the trace's
    mean requests per session. Unlike the mean over sessions that finished inside the window (biased to
    short sessions: real ones run for hours of tool calls), it counts every session's share of the work."""
    if not requests_completed or not trace.tasks:
        return None
    per_session = statistics.fmean(t.num_requests for t in trace.tasks)
    return agents * window * per_session / requests_completed


#: The job the forked workers of ``in_processes`` run (a fork inherits it; nothing is pickled but results).
_JOB: Callable[[int], Any] | None = None


def _run_job(index: int) -> Any:
    assert _JOB is not None
    return _JOB(index)


def in_processes(n: int, job: Callable[[int], Any], jobs: int) -> list[Any]:
    """``[job(0), …, job(n - 1)]``, each in a fresh forked process, ``jobs`` at a time (1: here, in order).

    Forked children share the parent's memory (the trace) copy-on-write; ``build_trace`` froze the trace out
    of the collector's reach, so a child does not copy it by walking it."""
    global _JOB
    if jobs <= 1 or n <= 1:
        return [job(i) for i in range(n)]
    _JOB = job
    try:
        pool = multiprocessing.get_context("fork").Pool(min(jobs, n), maxtasksperchild=1)
        try:
            return pool.map(_run_job, range(n), chunksize=1)
        finally:
            pool.close()
            pool.join()  # reaped: their CPU time is in ``children_cpu``
    finally:
        _JOB = None


def children_cpu() -> float:
    """CPU seconds of this process's finished children (the arms ``in_processes`` ran)."""
    times = os.times()
    return times.children_user + times.children_system


def sweep(
    args: argparse.Namespace,
    profile: EngineProfile,
    fleet: FleetSpec,
    names: list[str],
    build: TraceBuilder = build_trace,
) -> None:
    """Offered load (agents per Rank) × seeds: per load and arm, the seeds' mean of each figure."""
    table: list[dict[str, Any]] = []
    for load in (float(x) for x in args.agents_per_rank.split(",")):
        per_arm: dict[str, list[dict[str, Any]]] = {}
        for seed in (int(x) for x in args.seeds.split(",")):
            rows, _ = run_point(args, profile, fleet, names, round(load * fleet.ranks), seed, build)
            for row in rows:
                per_arm.setdefault(row["arm"], []).append(row)
        native = per_arm.get("native")
        for arm, rows in per_arm.items():
            latency = statistics.fmean(r["request_seconds"]["mean"] or 0.0 for r in rows)
            base = statistics.fmean(r["request_seconds"]["mean"] or 0.0 for r in native) if native else None
            censored = statistics.fmean(r["request_seconds_censored"] or 0.0 for r in rows)
            base_censored = (
                statistics.fmean(r["request_seconds_censored"] or 0.0 for r in native) if native else None
            )
            jcts = [r["jct_seconds"]["mean"] for r in rows if r["jct_seconds"]["mean"] is not None]
            little = statistics.fmean(r["jct_little_seconds"] or 0.0 for r in rows)
            base_little = statistics.fmean(r["jct_little_seconds"] or 0.0 for r in native) if native else None
            table.append({
                "profile": profile.name, "agents_per_rank": load, "arm": arm, "seeds": len(rows),
                "token_hit": statistics.fmean(r["token_hit"] or 0.0 for r in rows),
                "request_seconds_mean": latency, "x_native": latency / base if base else None,
                "x_native_censored": censored / base_censored if base_censored else None,
                "per_seed_x_native": [
                    (r["request_seconds"]["mean"] or 0.0) / (n["request_seconds"]["mean"] or 1.0)
                    for r, n in zip(rows, native or rows, strict=True)
                ],
                "per_seed_token_hit": [r["token_hit"] for r in rows],
                "requests_completed": statistics.fmean(r["requests_completed"] for r in rows),
                "session_jct_mean": statistics.fmean(jcts) if jcts else None,
                "jct_little": little, "jct_x_native": little / base_little if base_little else None,
                "prefill_gpu_seconds_saved": statistics.fmean(r["prefill_gpu_seconds_saved"] for r in rows),
                "preemptions": statistics.fmean(r["preemptions"] for r in rows),
                "queue_wait_mean": statistics.fmean(r["queue_wait_seconds"]["mean"] or 0.0 for r in rows),
                "queue_wait_p90": statistics.fmean(r["queue_wait_seconds"]["p90"] or 0.0 for r in rows),
                "trace_exhausted": sum(r["trace_exhausted"] for r in rows),
                **{name: statistics.fmean(r["transitions"][name] for r in rows) for name in TRANSITIONS},
            })  # fmt: skip
        print_sweep(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sweep.json").write_text(json.dumps(table, indent=2) + "\n")


def print_sweep(table: list[dict[str, Any]]) -> None:
    keys = ["profile", "agents_per_rank", "arm", "token_hit", "request_seconds_mean", "x_native",
            "x_native_censored", "jct_little", "jct_x_native", "requests_completed", "session_jct_mean",
            "prefill_gpu_seconds_saved", "preemptions", "queue_wait_mean", "queue_wait_p90", *TRANSITIONS,
            "trace_exhausted"]  # fmt: skip
    print("| " + " | ".join(keys) + " |")
    for row in table:
        print("| " + " | ".join(fmt(row[k]) for k in keys) + " |", flush=True)


if __name__ == "__main__":
    main()
