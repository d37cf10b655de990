"""What placement alone can do for a trace's token cache hit at a given KV size: placements compared in the
simulator (the emulator's own ``EngineCore`` per Rank, in virtual time, closed loop; see docs/simulator.md).

Placements (plain requests, no Program scheduling):
- ``native``: ``consistent_hash`` of the task's ``x-session-id`` (the bench's ``native`` arm);
- ``kv_aware``: the router's ``KvAwarePolicy`` decision, its residency read from the Ranks' block pools
  at the moment of the decision (no event lag: the best information it could have);
- ``sticky_best``: every task on one Rank, the assignment hill-climbed on the hit from a balanced start
  (moving one task at a time while the hit rises) — the best sticky placement this search finds;
- ``oracle``: ``native`` on Ranks whose KV never runs out (the bench's ``oracle`` arm).

Extra ``kv_aware`` variants: ``--variant NAME=JSON`` with ``KvAwareSettings`` fields and these, to model what
the live router knows: ``pending_seconds`` (how long a routed prefix counts as resident before it is
announced), ``stale_seconds`` (the residency read is a copy up to that old: an event stream that far behind),
``unknown_until_stored`` (a Rank that has published nothing yet is unknown, so requests go cache_aware's way
until every candidate was heard, as live at start-up), ``delay_seconds`` (a request reaches its Rank that long
after the decision: the client-to-engine latency of a live run, in modelled seconds).

``--turnaround SECONDS`` adds that much to the gap before every follow-up request of a Program, for every
placement: a live replay's client reads an answer and sends the next request later than the trace says (on a
loaded machine, times the bench's time scale).

    .venv/bin/python bench/kv_placement_bound.py --trace demo.trace.jsonl --num-blocks 2000 [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from progrouter.config import RouterConfig
from progrouter.engine.block_pool import BlockPool
from progrouter.routing.kv_aware import PENDING_SECONDS, KvAwarePolicy, KvAwareSettings, PendingBlocks
from progrouter.routing.kv_residency import held_prefix
from progrouter.routing.policies import CacheAwarePolicy, RoutingPolicy, RoutingRequest, cache_index_for
from progrouter.routing.target import Target
from progrouter.sim.arms import SimArm
from progrouter.sim.ranks import SIM_ENGINE_URL, FleetSpec
from progrouter.sim.requests import SimRequest
from progrouter.sim.routers import NativeRouter, session_headers
from progrouter.sim.simulation import Simulation
from progrouter.workload import trace as trace_mod
from progrouter.workload.trace import Trace, TraceProgram


class PoolView:
    """A Rank's residency as the policy's index would hold it, read from the Rank's block pool; with
    ``stale_seconds`` > 0, a copy taken at most that long ago (an event stream that far behind)."""

    def __init__(self, pool: BlockPool, clock: Callable[[], float], stale_seconds: float) -> None:
        self._pool = pool
        self._clock = clock
        self._stale = stale_seconds
        self._copy: Mapping[int, Any] = {}
        self._taken = -math.inf

    @property
    def engine_to_key(self) -> Mapping[int, Any]:
        if self._stale <= 0:
            return self._pool.cached_map
        now = self._clock()
        if now - self._taken >= self._stale:
            self._copy, self._taken = dict.fromkeys(self._pool.cached_map), now
        return self._copy


class PoolIndex:
    """``ResidencyIndex.match`` over the Ranks' block pools (keys are the engine's own block hashes)."""

    def __init__(self, sim: Simulation, stale_seconds: float, unknown_until_stored: bool) -> None:
        now = sim.clock
        self.ranks = {
            r.target.id: PoolView(r.core.kv.pool, lambda: now.now, stale_seconds) for r in sim.ranks
        }
        # As live: a Rank that has published nothing yet (an idle engine sends no events) is unknown.
        self._unheard = set(self.ranks) if unknown_until_stored else set()

    def match(self, source: str, keys: Sequence[int]) -> int | None:
        held = self.ranks[source].engine_to_key
        if source in self._unheard:
            if not held:
                return None
            self._unheard.discard(source)
        return held_prefix(keys, held)


class SimKvAware(KvAwarePolicy):
    """The router's policy with the simulated request's block hashes as its prompt keys."""

    def __init__(
        self,
        sim: Simulation,
        settings: KvAwareSettings,
        pending_seconds: float = PENDING_SECONDS,
        stale_seconds: float = 0.0,
        unknown_until_stored: bool = False,
    ) -> None:
        # the fallback serves Ranks not heard from yet (``unknown_until_stored``), as live
        fallback = CacheAwarePolicy(cache_index_for(RouterConfig(worker_urls=[SIM_ENGINE_URL])))
        index: Any = PoolIndex(sim, stale_seconds, unknown_until_stored)  # ResidencyIndex's match and ranks
        super().__init__(index, settings, None, fallback, lambda: sim.clock.now)
        self._sim = sim
        self.pending = PendingBlocks(pending_seconds)

    def prompt_keys(self, request: RoutingRequest) -> tuple[int, list[int]] | None:
        assert request.body is not None
        sim_request: SimRequest = request.body["sim"]
        r = sim_request.request
        hashes = self._sim.prompts.block_hashes(
            sim_request.program.program_id, sim_request.task.task_id, sim_request.request_id, r,
            self.settings.block_size,
        )  # fmt: skip
        assert hashes is not None
        return r.input_tokens, hashes


class BodyRouter(NativeRouter):
    """``NativeRouter`` handing the policy the simulated request (as ``body["sim"]``); with ``delay`` > 0
    the request reaches its Rank that long after the decision (in flight from the decision on, as live)."""

    def __init__(self, policy: RoutingPolicy, sim: Simulation, delay: float = 0.0) -> None:
        router = sim.router
        assert isinstance(router, NativeRouter)
        super().__init__(policy, router.targets, router._dispatch)
        self._clock = sim.clock
        self._delay = delay

    def submit(self, now: float, request: SimRequest) -> None:
        target = self.policy.select(
            self.targets, RoutingRequest(session_headers(request), {"sim": request}, b"")
        )
        self.policy.on_start(target)
        if self._delay > 0:
            self._clock.at(now + self._delay, lambda r: self._dispatch(r, target), request)
        else:
            self._dispatch(request, target)


class Sticky(RoutingPolicy):
    def __init__(self, assignment: Mapping[str, int]) -> None:
        super().__init__()
        self.assignment = assignment

    def select(self, candidates: Sequence[Target], request: RoutingRequest) -> Target:
        return candidates[self.assignment[request.headers["x-session-id"]]]


@dataclass(frozen=True)
class Outcome:
    hit: float
    jct_mean: float
    share: tuple[float, ...]
    wall: float


def run(
    trace: Trace, fleet: FleetSpec, tasks: int, make: Any = None, unbounded: bool = False, delay: float = 0.0
) -> Outcome:
    """One simulated arm: ``make(sim)`` builds its policy (None: native consistent hashing)."""
    started = time.perf_counter()
    sim = Simulation(trace, fleet, SimArm("placement", unbounded_kv=unbounded), max_concurrent_tasks=tasks)
    if make is not None:
        sim.router = BodyRouter(make(sim), sim, delay)
    result = sim.run()
    fig = result.figures
    ranks = fig["ranks"]
    total = sum(r["prompt_tokens"] for r in ranks) or 1
    return Outcome(
        fig["token_cache_hit"], fig["jct_seconds"]["mean"], tuple(r["prompt_tokens"] / total for r in ranks),
        time.perf_counter() - started,
    )  # fmt: skip


def best_sticky(trace: Trace, fleet: FleetSpec, tasks: int, rounds: int, seed: int) -> tuple[Outcome, int]:
    rng = random.Random(seed)
    ids = [t.task_id for t in sorted(trace.tasks, key=lambda t: t.start)]
    best = {t: i % fleet.ranks for i, t in enumerate(ids)}
    outcome = run(trace, fleet, tasks, lambda _sim: Sticky(best))
    tried = 1
    for _ in range(rounds):
        improved = False
        for t in rng.sample(ids, len(ids)):
            for r in range(fleet.ranks):
                if r == best[t]:
                    continue
                trial = {**best, t: r}
                o = run(trace, fleet, tasks, lambda _sim, a=trial: Sticky(a))
                tried += 1
                if o.hit > outcome.hit:
                    best, outcome, improved = trial, o, True
        if not improved:
            break
    return outcome, tried


def with_turnaround(trace: Trace, seconds: float) -> Trace:
    """``trace`` with ``seconds`` more before every request but the first of each Program."""
    if seconds <= 0:
        return trace

    def later(program: TraceProgram) -> TraceProgram:
        first, *rest = program.requests
        return replace(program, requests=(first, *(replace(r, gap=r.gap + seconds) for r in rest)))

    tasks = tuple(replace(t, programs=tuple(later(p) for p in t.programs)) for t in trace.tasks)
    return replace(trace, tasks=tasks, meta={**trace.meta, "turnaround_seconds": seconds})


def show(name: str, o: Outcome, note: str = "") -> None:
    share = "/".join(f"{s:.0%}" for s in o.share)
    print(f"  {name:30} hit {o.hit:6.1%}  JCT mean {o.jct_mean:6.0f} s  prompt tokens {share:9} {note}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", required=True, type=Path)
    parser.add_argument("--num-blocks", required=True, type=int, help="KV blocks per Rank")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-concurrent-tasks", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1, help="hill-climbing passes over the tasks (0: none)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=JSON")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--turnaround", type=float, default=0.0, help="seconds more before every follow-up")
    args = parser.parse_args(argv)
    trace = with_turnaround(trace_mod.load(args.trace), args.turnaround)
    fleet = FleetSpec(
        ranks=args.ranks,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_model_len=min(32768, args.num_blocks * args.block_size),
    )
    tasks = args.max_concurrent_tasks
    print(
        f"{args.trace}: {trace.num_requests} requests, {args.ranks} Ranks × {args.num_blocks} blocks"
        + (f", turnaround +{args.turnaround:g} s" if args.turnaround > 0 else "")
    )
    show("native", run(trace, fleet, tasks))
    settings = KvAwareSettings(block_size=args.block_size)
    show("kv_aware (exact residency)", run(trace, fleet, tasks, lambda sim: SimKvAware(sim, settings)))
    for spec in args.variant:
        name, _, fields = spec.partition("=")
        extra = json.loads(fields)
        pending = extra.pop("pending_seconds", PENDING_SECONDS)
        stale = extra.pop("stale_seconds", 0.0)
        unheard = extra.pop("unknown_until_stored", False)
        delay = extra.pop("delay_seconds", 0.0)
        variant = replace(settings, **extra)

        def make(sim: Simulation, v: KvAwareSettings = variant, p: float = pending, s: float = stale,
                 u: bool = unheard) -> SimKvAware:  # fmt: skip
            return SimKvAware(sim, v, p, s, u)

        show(f"kv_aware {name}", run(trace, fleet, tasks, make, delay=delay))
    if args.rounds:
        outcome, tried = best_sticky(trace, fleet, tasks, args.rounds, args.seed)
        show("sticky_best", outcome, f"({tried} assignments tried)")
    show("oracle (unbounded KV)", run(trace, fleet, tasks, unbounded=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
