"""Where a Program arm's cache misses come from: every prompt token a request had to compute again, by cause.

Runs ``bench/fleet_sim.py``'s arms on one trace and follows each request of each Program. A request of a
Program that ran before should find its previous prompt cached on its Rank; the tokens of that previous
prompt it did not find are *lost*, and each request's loss is charged to the first place it happened:

- ``migrated``: the request ran on another Rank than the Program's previous one;
- ``evicted_while_active``: gone already when the request arrived, although the Program was still Active
  (holding its placement through the tool call: the acting TTL, or no TTL at all under native routing);
- ``evicted_while_paused:<reason>``: gone when it arrived, and the Program had been paused since its last
  request (by the TTL, capacity repair, …);
- ``evicted_in_router_queue``: there when the request arrived, gone when the router dispatched it;
- ``evicted_in_engine_queue``: there at dispatch, gone when the engine first scheduled it (vLLM's waiting
  queue);
- ``first_turn`` (the Program's first request: the tokens no one had computed), ``growth`` (the new tokens
  of a turn) are inherent: the unbounded-KV oracle computes them too.

Preemptions (the engine freeing a running request to recompute it later) cost GPU time, not token hit (vLLM
counts a request's cached tokens once, at its first schedule); they are counted apart, with the tokens
recomputed. For every ``evicted_while_active`` loss it records what the Rank held when the request arrived:
the tokens the router believed in use (its ledger / backend estimate), the engine's blocks in use, and the
Active Acting Programs' actual contexts against what the ledger charged them, which shows whether the
Programs it admitted outgrew what it charged.

    .venv/bin/python bench/miss_causes.py --profile h200-llama-8b --ranks 4 --hours 0.5 --agents 128 \\
        --seed 0 --arms native --variant 'capwg={"token_capacity_per_dp_rank":"auto","global_queue":true}'
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_sim import build_arms, build_trace, fleet_spec, parse_variants
from progrouter.engine import PromptBlocks, RequestOutput
from progrouter.engine.profiles import load_profile
from progrouter.engine.request import Request
from progrouter.program import ProgramState
from progrouter.routing.target import Target
from progrouter.sim.ranks import SimRank
from progrouter.sim.requests import SimRequest
from progrouter.sim.routers import MODEL_POOL, NativeRouter, ProgramRouter
from progrouter.sim.simulation import Simulation

#: a request that finds less than this share of its Program's previous prompt "lost" it (for counts only;
#: the token figures charge every lost token)
LOST_SHARE = 0.9


#: tool-call lengths, seconds (the issue's gaps: p25 7 s, p50 13 s, p75 45 s, p90 187 s)
GAP_EDGES = (10.0, 30.0, 60.0, 180.0)
GAP_BUCKETS = ("<10s", "10-30s", "30-60s", "60-180s", ">180s")


def gap_bucket(seconds: float) -> str:
    return GAP_BUCKETS[sum(seconds >= edge for edge in GAP_EDGES)]


@dataclass(slots=True)
class Track:
    """One request as it goes: what its Rank held of the previous prompt at each step."""

    program_id: str
    step: int
    prev_rank: str | None
    prev_prompt: int
    gap: float  # seconds since the Program's previous request finished (its tool call)
    arrived_at: float
    state: str  # the Program at arrival: new / active / paused:<reason> / native
    hashes: list[int]
    at_arrival: int = 0  # tokens of the previous prompt cached on the previous Rank at arrival
    at_dispatch: int = 0
    rank: str | None = None
    active_context: dict[str, float] = field(default_factory=dict)


class Follower:
    """Instruments one Simulation (wrapping its router and dispatch; the arm's decisions are unchanged)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.tracks: dict[str, Track] = {}
        # program id -> (rank, prompt tokens, finish time) of its last request
        self.last: dict[str, tuple[str, int, float]] = {}
        self.gaps_lost: dict[str, Counter[str]] = defaultdict(Counter)  # cause -> gap bucket -> lost tokens
        self.gaps_all: Counter[str] = Counter()  # gap bucket -> reusable tokens of every return
        self.lost: Counter[str] = Counter()
        self.lost_requests: Counter[str] = Counter()
        self.inherent: Counter[str] = Counter()
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.preempted: Counter[str] = Counter()
        self.preempted_tokens = 0
        self.active_evictions: list[dict[str, float]] = []
        self.mature_at: dict[str, dict[str, float]] = {"request": {}, "continuity": {}}  # window -> Rank -> t
        self.by_rank = {r.target.id: r for r in sim.ranks}
        router = sim.router
        assert isinstance(router, NativeRouter | ProgramRouter)
        submit, dispatch = router.submit, router._dispatch

        def arriving(now: float, request: SimRequest) -> None:
            self._arrive(request)
            submit(now, request)

        def dispatching(request: SimRequest, target: Target) -> None:
            self._dispatched(request, target)
            dispatch(request, target)

        router.submit = arriving  # type: ignore[method-assign]
        router._dispatch = dispatching
        for rank in sim.ranks:
            self._watch(rank)

    def _watch(self, rank: SimRank) -> None:
        """Wrap the Rank's output handler and its engine's preemptions (the engine keeps no per-request
        record once a request finished)."""
        output = rank._on_output

        def finishing(r: SimRank, out: RequestOutput, now: float) -> None:
            self._output(r, out)
            output(r, out, now)

        rank._on_output = finishing

        def counting(request: Request) -> None:
            self.preempted[request.request_id] += 1
            self.preempted_tokens += request.num_computed_tokens

        rank.core.scheduler.on_preempt = counting

    def _held(self, rank_id: str | None, hashes: list[int], upto: int) -> int:
        """Leading tokens of ``hashes`` (at most ``upto``) cached on the Rank now."""
        if rank_id is None:
            return 0
        rank = self.by_rank[rank_id]
        cached = rank.core.kv.pool.cached_map
        size = rank.core.config.block_size
        n = 0
        for h in hashes[: upto // size]:
            if h not in cached:
                break
            n += 1
        return n * size

    def _state(self, program_id: str) -> str:
        router = self.sim.router
        if not isinstance(router, ProgramRouter):
            return "native"
        program = router.scheduler.parts.table.get(MODEL_POOL, program_id)
        if program is None:
            return "new"
        if program.state is ProgramState.ACTIVE:
            return "active"
        reason = program.last_pause_reason
        return f"paused:{reason.value if reason is not None else 'unplaced'}"

    def _arrive(self, request: SimRequest) -> None:
        pid = request.program.program_id
        prompt = self.sim._prompt(request, self.sim.fleet.block_size)
        hashes = prompt.block_hashes if isinstance(prompt, PromptBlocks) else []
        prev_rank, prev_prompt, prev_at = self.last.get(pid, (None, 0, self.sim.clock.now))
        gap = self.sim.clock.now - prev_at
        track = Track(
            pid, request.step, prev_rank, prev_prompt, gap, self.sim.clock.now, self._state(pid), list(hashes)
        )
        track.at_arrival = self._held(prev_rank, track.hashes, prev_prompt)
        if track.state == "active" and prev_rank is not None and track.at_arrival < LOST_SHARE * prev_prompt:
            track.active_context = self._rank_picture(prev_rank)
        self.tracks[request.request_id] = track

    def _rank_picture(self, rank_id: str) -> dict[str, float]:
        """What the router believed and the engine held on the Rank just now."""
        router = self.sim.router
        assert isinstance(router, ProgramRouter)
        scheduler = router.scheduler
        now = self.sim.clock.now
        rank = self.by_rank[rank_id]
        acting_charged = acting_actual = 0.0
        for program in scheduler.parts.table:
            if program.placement == rank_id and program.active and program.acting:
                acting_charged += scheduler.parts.ledger.charged(program)
                last = self.last.get(program.ref.program_id)
                acting_actual += last[1] if last else 0
        capacity = rank.core.config.num_blocks * rank.core.config.block_size
        return {
            "capacity": capacity,
            "router_used": scheduler.parts.ledger.usage(rank_id, now),
            "engine_in_use": rank.core.kv_cache_usage() * capacity,
            "acting_charged": acting_charged,
            "acting_actual_prompts": acting_actual,
        }

    def _dispatched(self, request: SimRequest, target: Target) -> None:
        track = self.tracks[request.request_id]
        track.rank = target.id
        if target.id == track.prev_rank:
            track.at_dispatch = self._held(target.id, track.hashes, track.prev_prompt)

    def _output(self, rank: SimRank, output: RequestOutput) -> None:
        if not output.finished:
            return
        track = self.tracks.pop(output.request_id)
        self._note_maturity(rank.target.id)
        prompt, cached = output.num_prompt_tokens, output.num_cached_tokens
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        self.last[track.program_id] = (rank.target.id, prompt, self.sim.clock.now)
        if track.prev_rank is None:
            self.inherent["first_turn"] += prompt - cached
            return
        reusable = min(track.prev_prompt, prompt)
        self.inherent["growth"] += max(0, prompt - max(reusable, cached))
        lost = max(0, reusable - cached)
        bucket = gap_bucket(track.gap)
        self.gaps_all[bucket] += reusable
        if lost == 0:
            return
        cause = self._cause(track, reusable)
        if self._cold(track):
            cause += " (window cold)"
        self.lost[cause] += lost
        self.gaps_lost[cause][bucket] += lost
        if cached < LOST_SHARE * reusable:
            self.lost_requests[cause] += 1
            if cause == "evicted_while_active" and track.active_context:
                self.active_evictions.append(track.active_context)

    def _note_maturity(self, rank_id: str) -> None:
        """When each of the Rank's statistics windows first held ``stats_window_size`` samples."""
        router = self.sim.router
        if not isinstance(router, ProgramRouter):
            return
        factors = router.scheduler.parts.stats.get(rank_id)
        if factors is None:
            return
        now = self.sim.clock.now
        for window, complete in (
            ("request", factors.request_window_complete()),
            ("continuity", factors.continuity_window_complete()),
        ):
            if complete:
                self.mature_at[window].setdefault(rank_id, now)

    def _cold(self, track: Track) -> bool:
        """Whether the Program's Rank's continuity window was still incomplete when the request arrived (the
        spec's TTL is 0 until then). Never for native arms."""
        if not isinstance(self.sim.router, ProgramRouter) or track.prev_rank is None:
            return False
        mature = self.mature_at["continuity"].get(track.prev_rank)
        return mature is None or track.arrived_at < mature

    @staticmethod
    def _cause(track: Track, reusable: int) -> str:
        """The first place the previous prompt went missing (see the module docstring)."""
        if track.rank != track.prev_rank:
            return "migrated"
        full = LOST_SHARE * reusable
        if track.at_arrival < full:
            if track.state.startswith("paused"):
                return f"evicted_while_{track.state}"
            return "evicted_while_active"
        if track.at_dispatch < full:
            return "evicted_in_router_queue"
        return "evicted_in_engine_queue"

    def report(self) -> dict[str, Any]:
        total = self.prompt_tokens or 1
        pictures = self.active_evictions
        return {
            "arm": self.sim.arm.name,
            "token_hit": self.cached_tokens / total,
            "lost_share_of_prompt_tokens": {k: v / total for k, v in self.lost.most_common()},
            "lost_requests": dict(self.lost_requests.most_common()),
            "inherent_share_of_prompt_tokens": {k: v / total for k, v in self.inherent.items()},
            "preempted_requests": len(self.preempted),
            "preemptions": sum(self.preempted.values()),
            "preempted_recompute_share_of_prompt_tokens": self.preempted_tokens / total,
            "reusable_share_by_gap": {b: self.gaps_all[b] / total for b in GAP_BUCKETS},
            "lost_share_by_cause_and_gap": {
                c: {b: g[b] / total for b in GAP_BUCKETS if g[b]} for c, g in self.gaps_lost.items()
            },
            "windows_mature_at_seconds": {w: sorted(t.values()) for w, t in self.mature_at.items()},
            "active_eviction_pictures": len(pictures),
            "active_eviction_mean": {
                k: statistics.fmean(p[k] for p in pictures) for k in (pictures[0] if pictures else {})
            },
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="h200-llama-8b")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--agents", type=int, default=128)
    ap.add_argument("--reserve", type=float, default=0.5)
    ap.add_argument("--hours", type=float, default=0.5)
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arms", default="native")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=JSON")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    profile = load_profile(args.profile)
    fleet = fleet_spec(profile, args.ranks, args.block_size, 256)
    trace = build_trace(args.agents, args.seed, args.reserve, fleet)
    names = [a for a in args.arms.split(",") if a]
    reports = []
    for arm in build_arms(names, profile, fleet, args.agents, parse_variants(args.variant)):
        sim = Simulation(trace, fleet, arm, max_concurrent_tasks=args.agents, until=args.hours * 3600.0)
        follower = Follower(sim)
        sim.run()
        report = follower.report()
        reports.append(report)
        print(json.dumps(report, indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1) + "\n")


if __name__ == "__main__":
    main()
