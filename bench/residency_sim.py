"""Residency-aware Program scheduling in the simulator: the Program arm with and without ``residency_aware``,
over several seeds, on any workload ``progrouter simulate`` takes. Prints, per seed and arm, mean and p90 JCT,
token cache hit, queue wait, cross-Rank resumes, and how often each residency rule fired (``ttl_end``: an
Acting Program's TTL ended because its Rank no longer held its prompt; ``stay_home``: a cross-Rank pass left
a waiting Program on the Rank that still held its prompt; ``holder_bind``: a new Program bound to the Rank
holding its prompt's prefix).

The case where TTL guesses are wrong (agents that ask for a long retention on every tool call, KV smaller
than the Programs' working set, so LRU evicts Acting Programs' KV while the ledger still charges it):

    nice -n 10 .venv/bin/python bench/residency_sim.py --generate coding --tasks 24 --ranks 2 \\
        --num-blocks 768 --block-size 64 --long-gap-prob 0.3 --hint 60 --seeds 0,1,2,3
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from progrouter.sim import cli as sim_cli
from progrouter.sim.residency import rules_fired
from progrouter.sim.routers import ProgramRouter
from progrouter.sim.simulation import Simulation

RESIDENCY = '{"residency_aware": true}'


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, dict[str, Any]]:
    args.seed = seed
    args.arms = "program"
    args.variant = [f"residency={RESIDENCY}"]
    trace = sim_cli.load_trace(args)
    fleet = sim_cli.fleet_from_args(args, trace)
    arms, _ = sim_cli.arms_from_args(args, fleet)
    out = {}
    for arm in arms:
        sim = Simulation(trace, fleet, arm, salt=args.salt, max_concurrent_tasks=args.max_concurrent_tasks)
        result = sim.run()
        figures = result.figures
        assert isinstance(sim.router, ProgramRouter)
        fired = rules_fired(sim.router.observer)
        out[arm.name] = {
            "jct_mean": figures["jct_seconds"]["mean"],
            "jct_p90": figures["jct_seconds"]["p90"],
            "hit": figures["token_cache_hit"],
            "queue_mean": figures["queue_wait"]["mean"],
            "cross_rank": figures["transitions"].get("cross_rank_resume", 0),
            "ttl_expired": figures["transitions"].get("ttl_expired", 0),
            **{rule: fired.get(rule, 0) for rule in ("ttl_end", "stay_home", "holder_bind")},
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sim_cli.add_arguments(parser)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated trace seeds")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    columns = ("jct_mean", "jct_p90", "hit", "queue_mean", "cross_rank", "ttl_expired", "ttl_end",
               "stay_home", "holder_bind")  # fmt: skip
    print(f"{'seed':>4} {'arm':<10} " + " ".join(f"{c:>11}" for c in columns))
    ratios = []
    for seed in seeds:
        rows = run_seed(args, seed)
        for name, row in rows.items():
            cells = " ".join(
                f"{row[c]:>11.3f}" if isinstance(row[c], float) else f"{row[c]:>11}" for c in columns
            )
            print(f"{seed:>4} {name:<10} {cells}", flush=True)
        ratios.append(rows["residency"]["jct_mean"] / rows["program"]["jct_mean"])
    print(
        f"mean JCT residency/program over {len(seeds)} seeds: {statistics.mean(ratios):.3f} "
        f"(per seed {', '.join(f'{r:.3f}' for r in ratios)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
