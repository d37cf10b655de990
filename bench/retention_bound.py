"""How close to the unbounded-KV oracle any scheduler can get when the KV holds only some agents' contexts.

The oracle keeps every agent's context through every tool call. A real Rank of ``K`` KV tokens serving ``N``
agents cannot: the KV-token-seconds a Rank offers per agent request are ``K × (g + L) / N`` (``g`` the tool
call before the request, ``L`` its latency), and holding a context of ``C`` tokens through a tool call of
``g`` seconds spends ``C × g`` of them. A context not held is recomputed when the agent returns: ``C`` more
uncached prompt tokens and about ``prefill(C)`` more seconds of that request's latency.

This computes, from the sweep's own traces, a bound that is generous to the scheduler on purpose:

- it knows every tool call's length in advance and may hold a context for part of one (a fractional
  knapsack: hold the tool calls with the most recompute seconds saved per KV-token-second first, which is
  optimal for that relaxation);
- the KV is free for held contexts all the time (the requests being served, their growth and outputs, take
  none of it), and nothing but the held context is needed for a hit;
- a miss costs only its own request ``prefill(C)`` (the profile's cold-prefill model): the prefill does not
  slow the other requests batched with it, and the oracle's measured latency ``L_o`` is the floor.

So with ``h`` the held share of each tool call, ``L ≥ L_o + mean((1 − h) · prefill(C))`` and
``N · Σ C·g·h ≤ K · Σ (g + L)``; the smallest ``L`` that satisfies both (bisection: the right side grows with
``L``) is a lower bound on any scheduler's mean request latency, and the hit at the target latency an upper
bound on its token hit (first turns and each turn's new tokens are misses for the oracle too).

    .venv/bin/python bench/retention_bound.py --profile h200-llama-8b --agents-per-rank 32 --ranks 4 \\
        --seeds 0,1,2,3,4 --oracle-latency 12.35 --target-ratio 1.5
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from fleet_sim import build_trace, fleet_spec
from progrouter.config import PrefillCostModel
from progrouter.engine.profiles import load_profile
from progrouter.workload.trace import Trace


@dataclass(frozen=True, slots=True)
class Turns:
    """Every request of a trace: its prompt, the previous prompt's blocks it reuses, the tool call before."""

    prompt: np.ndarray  # tokens
    reused: np.ndarray  # tokens of the previous request's prompt this one starts with (0 for a first turn)
    gap: np.ndarray  # seconds of tool call before it (0 for a first turn)


def turns(trace: Trace) -> Turns:
    prompt, reused, gap = [], [], []
    for task in trace.tasks:
        for program in task.programs:
            previous: tuple[int, ...] = ()
            for request in program.requests:
                common = 0
                for a, b in zip(previous, request.hash_ids, strict=False):
                    if a != b:
                        break
                    common += 1
                prompt.append(request.input_tokens)
                reused.append(min(common * trace.block_size, request.input_tokens) if previous else 0)
                gap.append(request.gap if previous else 0.0)
                previous = request.hash_ids
    return Turns(np.array(prompt, float), np.array(reused, float), np.array(gap, float))


class Bound:
    """The fractional knapsack of one trace at ``agents`` per Rank of ``capacity`` KV tokens."""

    def __init__(self, t: Turns, agents: float, capacity: float, model: PrefillCostModel) -> None:
        self.t, self.agents, self.capacity = t, agents, capacity
        self.saved = np.array([model.prefill_seconds(c) if c > 0 else 0.0 for c in t.reused])
        weight = t.reused * t.gap
        order = np.argsort(-(self.saved / np.maximum(weight, 1e-9)), kind="stable")
        self.order = order
        self.weight_cum = np.cumsum(weight[order])

    def held(self, latency: float) -> np.ndarray:
        """The held share of each request's tool call at mean latency ``latency`` (the knapsack's fill)."""
        t = self.t
        budget = self.budget(latency)
        h = np.zeros(len(t.prompt))
        full = int(np.searchsorted(self.weight_cum, budget, side="right"))
        h[self.order[:full]] = 1.0
        if full < len(self.order):
            rest = budget - (self.weight_cum[full - 1] if full else 0.0)
            i = self.order[full]
            w = t.reused[i] * t.gap[i]
            h[i] = min(1.0, rest / w) if w > 0 else 1.0
        return h

    def budget(self, latency: float) -> float:
        """KV-token-seconds all requests together may hold tool calls with, at mean latency ``latency``."""
        return self.capacity * float(np.sum(self.t.gap + latency)) / self.agents

    def extra_seconds(self, latency: float) -> float:
        return float(np.mean((1.0 - self.held(latency)) * self.saved))

    def hit(self, latency: float) -> float:
        return float(np.sum(self.held(latency) * self.t.reused) / np.sum(self.t.prompt))

    def least_latency(self, oracle: float) -> float:
        """The smallest L with L ≥ oracle + extra_seconds(L) (extra only falls as L grows)."""
        lo, hi = oracle, oracle + self.extra_seconds(oracle)
        for _ in range(60):
            mid = (lo + hi) / 2
            if mid >= oracle + self.extra_seconds(mid):
                hi = mid
            else:
                lo = mid
        return hi


#: the TTLs the online bound chooses from, seconds
TTLS = np.array([0, 1, 2, 3, 5, 7, 10, 13, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1200, 3600], float)


class TTLBound(Bound):
    """The same, for a scheduler that does not know how long a tool call will be, only their distribution.

    Each request's context is held for a TTL ``τ`` chosen from its size: it costs ``C · min(g, τ)`` and hits
    only when ``g ≤ τ``. For a price ``λ`` per KV-token-second every request takes the ``τ`` with the best
    expected saving, ``prefill(C) · P(g ≤ τ) − λ · C · E[min(g, τ)]`` (the gaps' empirical distribution), and
    ``λ`` is bisected until the expected cost fits the budget: the best TTL rule of this kind. The agentic
    generator draws each tool call independently, so whatever lets a context go without knowing when its
    agent returns (the spec's fitted TTL, the weighed TTL, vLLM's LRU) is such a rule or a mixture."""

    def __init__(self, t: Turns, agents: float, capacity: float, model: PrefillCostModel) -> None:
        super().__init__(t, agents, capacity, model)
        gaps = np.sort(t.gap[t.reused > 0])
        self.within = np.searchsorted(gaps, TTLS, side="right") / len(gaps)  # P(g ≤ τ)
        self.mean_min = np.array([float(np.mean(np.minimum(gaps, tau))) for tau in TTLS])  # E[min(g, τ)]

    def _choose(self, price: float) -> np.ndarray:
        gain = (
            self.saved[:, None] * self.within[None, :]
            - price * self.t.reused[:, None] * self.mean_min[None, :]
        )
        return np.argmax(gain, axis=1)

    def held(self, latency: float) -> np.ndarray:
        """The probability each request hits: ``P(g ≤ τ)`` of the TTL chosen at the budget's price."""
        budget, reused = self.budget(latency), self.t.reused
        lo, hi = 0.0, float(np.max(self.saved / np.maximum(reused, 1.0))) / float(self.mean_min[1]) + 1.0
        for _ in range(60):
            price = (lo + hi) / 2
            if float(np.sum(reused * self.mean_min[self._choose(price)])) > budget:
                lo = price
            else:
                hi = price
        return np.asarray(self.within[self._choose(hi)])


def fit_and_finish_latency(
    t: Turns, agents: float, capacity: float, oracle: float
) -> tuple[float, float, float]:
    """Mean latency of "run as many agents as fit and let each finish" (hold every context through every
    tool call, queue the rest), by Little's law for the closed loop: ``capacity / mean context`` agents hold
    a slot, each for a tool call plus at least the oracle's latency per request, so the ``agents`` share
    ``fits / (g + L_o)`` requests per second and each request takes ``agents / rate − g``. Returns the
    latency, the agents that fit and the mean tool call."""
    fits = capacity / float(np.mean(t.reused[t.reused > 0]))
    gap = float(np.mean(t.gap))
    return max(oracle, agents * (gap + oracle) / fits - gap), fits, gap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="h200-llama-8b")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--agents-per-rank", type=float, default=32)
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--reserve", type=float, default=0.5, help="as fleet_sim.py's")
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--oracle-latency", type=float, required=True, help="the oracle's mean request seconds")
    ap.add_argument("--target-ratio", type=float, default=1.5)
    ap.add_argument("--at", type=float, action="append", default=[], help="also the hit bound at this L (s)")
    args = ap.parse_args()
    profile = load_profile(args.profile)
    fleet = fleet_spec(profile, args.ranks, args.block_size, 256)
    agents = round(args.agents_per_rank * args.ranks)
    oracle = args.oracle_latency
    print(
        f"{profile.name}: {fleet.capacity_tokens:,} KV tokens per Rank, {args.agents_per_rank:g} agents "
        f"per Rank; oracle latency {oracle:g} s"
    )
    head = "| seed | scheduler | hit holding everything | least latency s | × oracle | hit bound there |"
    print(
        head + f" hit bound at {args.target_ratio:g}× oracle |" + "".join(f" at {a:g} s |" for a in args.at)
    )
    for seed in (int(s) for s in args.seeds.split(",")):
        t = turns(build_trace(agents, seed, args.reserve, fleet))
        inputs = (t, args.agents_per_rank, fleet.capacity_tokens, profile.prefill_cost_model)
        for kind, bound in (("knows each gap", Bound(*inputs)), ("TTL rule", TTLBound(*inputs))):
            least = bound.least_latency(oracle)
            cells = [
                seed,
                kind,
                float(np.sum(t.reused) / np.sum(t.prompt)),
                least,
                least / oracle,
                bound.hit(least),
                bound.hit(args.target_ratio * oracle),
                *(bound.hit(a) for a in args.at),
            ]
            print(
                "| " + " | ".join(f"{c:.3f}" if isinstance(c, float) else str(c) for c in cells) + " |",
                flush=True,
            )
        finish, fits, gap = fit_and_finish_latency(t, args.agents_per_rank, fleet.capacity_tokens, oracle)
        print(
            f"| {seed} | run as many as fit ({fits:.1f} per Rank; mean tool call {gap:.0f} s), each to the "
            f"end | – | {finish:.1f} | {finish / oracle:.2f} | – |"
        )


if __name__ == "__main__":
    main()
