"""Cost of the sans-I/O Program scheduler core: per arrival+completion and per tick.

Drives ``ProgramScheduler`` in virtual time with N Programs over R Ranks (default 10,000 over 64: 8 workers
× 8 DP Ranks), token capacity configured so Ranks are full and queues are long. After a warm-up that puts
every Program in play, each measured step (1 ms of virtual time) completes the oldest in-flight request
(with usage) and sends that Program into a tool call, and the Program whose tool call is oldest (~2 s) sends
its next request; a completion usually pauses or arms a TTL, an arrival usually queues, and freed capacity
admits another Program. Ticks run between steps with the whole population in place.

Two arms: ``cold`` (windows that never complete: TTL 0 unless hinted, no growth reserve, static force
deadlines) and ``mature`` (default 100-sample windows, full after the warm-up: fitted TTLs, growth reserve,
batch gain and workload-derived force-resume deadlines are all computed). A third of the requests carry a
``kv_retention_ttl_seconds`` hint. Targets: < 100 µs per arrival+completion, < 20 ms per tick.

    .venv/bin/python bench/scheduler_core.py [--programs 10000] [--ranks 64] [--steps 20000] [--ticks 50]

``--paired OTHER_SRC`` compares this tree with another one (its ``src`` directory) on a shared machine: two
processes, one per tree, each warmed up with ``--steps`` steps, then run ``--chunks`` chunks of
``--chunk-steps`` steps in turn (alternating which goes first); it prints each tree's median CPU µs per step,
the median and interquartile range of this/other per chunk pair, the ratio of the sums (which counts the
garbage collector's rarer, longer pauses as the plain run's mean does) and both trees' end counts.
``--repeats K`` runs K such pairs of fresh processes: on a virtual machine each process draws its own
bias (which core, memory layout, hash seed) of a few per cent that no number of chunks averages away, so the
figure to quote is the median over the K runs' medians, printed last with every run's.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from progrouter.config import ProgramSchedulingConfig
from progrouter.program import (
    BackendObservation,
    Dispatched,
    ProgramDispatch,
    ProgramIdentity,
    ProgramRequest,
    ProgramScheduler,
    RequestHints,
    UsageObservation,
)
from progrouter.routing.target import Target

POOL = "program:model:bench"


def build(arm: str, ranks: int, programs: int) -> tuple[ProgramScheduler, list[Target]]:
    workers = max(1, ranks // 8)
    per_worker = ranks // workers
    targets = [
        Target(f"http://w{w}:8000@{r}", f"http://w{w}:8000", r)
        for w in range(workers)
        for r in range(per_worker)
    ]
    config: dict[str, Any] = {
        "token_capacity_per_dp_rank": 400_000,
        "low_watermark_ratio": 0.9,
        "high_watermark_ratio": 0.95,
        "global_queue": True,
        "max_pooled_requests": programs,  # every Program may wait at once (the default bounds a live pool)
    }
    if arm == "cold":  # windows never complete: TTL 0 unless hinted, no reserve, static force deadlines
        config |= {"stats_window_size": 1_000_000}
    scheduler = ProgramScheduler(ProgramSchedulingConfig(**config))
    # ``--paired`` runs this file against older trees too, whose scheduler called it ``set_targets``
    set_ranks = getattr(scheduler, "set_ranks", None) or scheduler.set_targets  # type: ignore[attr-defined]
    set_ranks(POOL, targets, 0.0)
    return scheduler, targets


class Driver:
    """Closed loop: a completed Program spends a tool call (``tool_gap`` steps, ~2 s) before its next one."""

    def __init__(self, scheduler: ProgramScheduler, programs: int, seed: int, tool_gap: int = 2000) -> None:
        self.scheduler = scheduler
        self.rng = random.Random(seed)
        self.contexts = [self.rng.randint(2_000, 30_000) for _ in range(programs)]
        self.in_flight: deque[ProgramDispatch] = deque()
        self.in_tool_call: deque[int] = deque(range(programs - tool_gap, programs))
        self.starting = programs - tool_gap
        self.now = 0.0

    def request(self, i: int) -> ProgramRequest:
        pid = f"task{i}:lead"
        identity = ProgramIdentity(pid, pid, f"header:x-session-id:task{i}")
        ttl = 2.0 if i % 3 == 0 else None  # a third of the requests carry a kv_retention_ttl hint
        return ProgramRequest(identity, RequestHints(kv_retention_ttl_seconds=ttl), POOL, self.contexts[i])

    def collect(self) -> None:
        for outcome in self.scheduler.take_outcomes():
            if isinstance(outcome, Dispatched):
                self.in_flight.append(outcome.dispatch)

    def step(self) -> None:
        """Complete the oldest in-flight request (its Program goes to a tool call); the Program whose tool
        call is the oldest sends its next request."""
        self.now += 0.001
        dispatch = self.in_flight.popleft()
        i = int(dispatch.program.program_id[4:].split(":")[0])
        prompt = self.contexts[i]
        self.contexts[i] = prompt + self.rng.randint(100, 600)
        usage = UsageObservation(
            prompt_tokens=prompt, completion_tokens=200, cached_tokens=int(prompt * 0.95)
        )
        self.scheduler.complete(self.now, dispatch, success=True, usage=usage, decode_seconds=2.0)
        self.in_tool_call.append(i)
        self.scheduler.arrive(self.now, self.request(self.in_tool_call.popleft()))
        self.collect()


def observe(scheduler: ProgramScheduler, targets: list[Target], now: float, rng: random.Random) -> None:
    epoch = scheduler.begin_observation(now)
    observations = {t.id: BackendObservation(rng.uniform(0.5, 0.9), rng.randint(20, 60), 0) for t in targets}
    scheduler.apply_observations(now, epoch, observations)


def warmed(arm: str, programs: int, ranks: int, steps: int, seed: int) -> tuple[Driver, list[Target]]:
    """The arm's scheduler with every Program in play and ``steps`` steps run (windows fill, queues
    settle)."""
    scheduler, targets = build(arm, ranks, programs)
    driver = Driver(scheduler, programs, seed)
    for i in range(driver.starting):
        driver.now += 0.0001
        scheduler.arrive(driver.now, driver.request(i))
    driver.collect()
    for _ in range(steps):
        driver.step()
    return driver, targets


def counts(scheduler: ProgramScheduler, now: float) -> tuple[int, int]:
    """Active and queued Programs over every Rank."""
    snapshot = scheduler.diagnostics(now)
    active = sum(r["router_active_programs"] for r in snapshot["ranks"])
    return active, sum(r["router_queued_programs"] for r in snapshot["ranks"])


def run_arm(arm: str, programs: int, ranks: int, steps: int, ticks: int, seed: int) -> dict[str, float]:
    driver, targets = warmed(arm, programs, ranks, steps, seed)
    scheduler = driver.scheduler
    step_times: list[float] = []
    cpu_start = time.process_time()
    for _ in range(steps):
        start = time.perf_counter()
        driver.step()
        step_times.append(time.perf_counter() - start)
    step_cpu = (time.process_time() - cpu_start) / steps
    tick_times: list[float] = []
    tick_cpu = 0.0
    for k in range(ticks):
        driver.now += 0.05
        if k % 2 == 0:
            observe(scheduler, targets, driver.now, driver.rng)
        cpu = time.process_time()
        start = time.perf_counter()
        scheduler.tick(driver.now)
        tick_times.append(time.perf_counter() - start)
        tick_cpu += time.process_time() - cpu
        driver.collect()
        for _ in range(20):
            driver.step()
    active, queued = counts(scheduler, driver.now)
    step_times.sort()
    return {
        "step_cpu_us": step_cpu * 1e6,
        "tick_cpu_ms": tick_cpu / max(1, ticks) * 1e3,
        "step_mean_us": statistics.fmean(step_times) * 1e6,
        "step_p50_us": step_times[len(step_times) // 2] * 1e6,
        "step_p99_us": step_times[int(len(step_times) * 0.99)] * 1e6,
        "tick_mean_ms": statistics.fmean(tick_times) * 1e3,
        "tick_max_ms": max(tick_times) * 1e3,
        "active": active,
        "queued": queued,
    }


def worker(args: argparse.Namespace) -> None:
    """One side of ``--paired``: warm up, then run the chunk of steps each line of stdin asks for and print
    its CPU seconds (0 asks for the end counts)."""
    driver, _ = warmed(args.arm, args.programs, args.ranks, args.steps, args.seed)
    print("ready", flush=True)
    for line in sys.stdin:
        n = int(line)
        if n == 0:
            active, queued = counts(driver.scheduler, driver.now)
            print(f"{active}/{queued}", flush=True)
            continue
        cpu = time.process_time()
        for _ in range(n):
            driver.step()
        print(time.process_time() - cpu, flush=True)


def paired(args: argparse.Namespace) -> float:
    """This tree against ``args.paired`` (another tree's ``src``), chunk by chunk (see the docstring); the
    median this/other ratio per chunk pair."""
    here = str(Path(__file__).resolve().parents[1] / "src")
    common = ["--worker", "--arm", args.arm, "--programs", str(args.programs), "--ranks", str(args.ranks)]
    common += ["--steps", str(args.steps), "--seed", str(args.seed)]
    sides = [
        subprocess.Popen(
            [sys.executable, __file__, *common],
            env=dict(os.environ, PYTHONPATH=src),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for src in (args.paired, here)
    ]
    for side in sides:
        assert side.stdin is not None and side.stdout is not None
        assert side.stdout.readline().strip() == "ready"

    def ask(side: subprocess.Popen[str], n: int) -> str:
        assert side.stdin is not None and side.stdout is not None
        side.stdin.write(f"{n}\n")
        side.stdin.flush()
        return side.stdout.readline().strip()

    other: list[float] = []
    this: list[float] = []
    for k in range(args.chunks):
        first, second = (0, 1) if k % 2 == 0 else (1, 0)
        cpu = {first: float(ask(sides[first], args.chunk_steps))}
        cpu[second] = float(ask(sides[second], args.chunk_steps))
        other.append(cpu[0])
        this.append(cpu[1])
    ends = [ask(side, 0) for side in sides]
    for side in sides:
        assert side.stdin is not None
        side.stdin.close()
        side.wait()
    ratios = [b / a for a, b in zip(other, this, strict=True)]
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    per_step = 1e6 / args.chunk_steps
    print(
        f"{args.arm}: {args.chunks} chunk pairs of {args.chunk_steps} steps after {args.steps} warm-up steps"
    )
    print(
        f"CPU µs per step, median: other {statistics.median(other) * per_step:.1f}, "
        f"this {statistics.median(this) * per_step:.1f}"
    )
    print(
        f"this/other per pair: median {median:.3f} (IQR {q1:.3f}–{q3:.3f}); sums {sum(this) / sum(other):.3f}"
    )
    print(f"active/queued at the end: other {ends[0]}, this {ends[1]}; load {os.getloadavg()[0]:.1f}")
    return median


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--programs", type=int, default=10_000)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--ticks", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--arm", choices=("cold", "mature", "both"), default="both")
    parser.add_argument("--paired", metavar="OTHER_SRC", help="compare with another tree's src (see above)")
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--chunk-steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=1, help="pairs of fresh processes (see above)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    arms = ("cold", "mature") if args.arm == "both" else (args.arm,)
    if args.paired:
        for arm in arms:
            medians = [paired(argparse.Namespace(**{**vars(args), "arm": arm})) for _ in range(args.repeats)]
            if args.repeats > 1:
                runs = ", ".join(f"{m:.3f}" for m in medians)
                overall = statistics.median(medians)
                print(f"{arm}: median over {args.repeats} runs {overall:.3f} (runs: {runs})")
        return
    print(
        f"{args.programs} Programs over {args.ranks} Ranks, {args.steps} measured steps, {args.ticks} ticks"
    )
    print("CPU = process time per operation (robust on a shared machine); wall = perf_counter per operation")
    step_head, tick_head = "arrival+completion µs: CPU | wall p50/p99", "tick ms: CPU | wall max"
    print(f"{'arm':<8}{step_head:<44}{tick_head:<26}active/queued")
    for arm in arms:
        r = run_arm(arm, args.programs, args.ranks, args.steps, args.ticks, args.seed)
        step = f"{r['step_cpu_us']:.1f} | {r['step_p50_us']:.1f} / {r['step_p99_us']:.1f}"
        tick = f"{r['tick_cpu_ms']:.2f} | {r['tick_max_ms']:.2f}"
        print(f"{arm:<8}{step:<44}{tick:<26}{r['active']:.0f}/{r['queued']:.0f}")
    print("targets: < 100 µs per arrival+completion, < 20 ms per tick")


if __name__ == "__main__":
    main()
