"""How long ``/scheduling/diagnostics`` takes to render, and how large it is, with many live Programs.

Builds a ``ProgramScheduler`` in-process with ``--programs`` Programs over ``--ranks`` Ranks (fake clock: each
Program completes one request and stays Paused, as distinct agents leave it), then renders the snapshot the
way the route does (``scheduler.diagnostics`` + ``json.dumps``) for a few page sizes and prints, per page,
the render time (best and median of ``--repeat``) and the bytes. The route renders synchronously, so its
render time is also the longest the event loop (and ``/liveness``) waits behind one diagnostics call.

    .venv/bin/python bench/diagnostics.py [--programs 50000] [--ranks 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from progrouter.config import ProgramSchedulingConfig
from progrouter.program.outcomes import Dispatched, ProgramRequest
from progrouter.program.scheduler import ProgramScheduler
from progrouter.program.types import ProgramIdentity, RequestHints, UsageObservation
from progrouter.routing.target import Target

POOL = "program:model:m"


def build(programs: int, ranks: int) -> ProgramScheduler:
    config = ProgramSchedulingConfig(max_paused_programs=programs)
    scheduler = ProgramScheduler(config)
    scheduler.set_targets(POOL, [Target.parse(f"http://w:1@{r}") for r in range(ranks)], 0.0)
    for i in range(programs):
        now = i * 0.001
        pid = f"task-{i}:agent"
        identity = ProgramIdentity(
            program_id=pid, placement_key=pid, placement_hash_key=f"header:x:{pid}", task_id=f"task-{i}"
        )
        scheduler.arrive(now, ProgramRequest(identity, RequestHints(request_id=f"r{i}"), POOL, 500))
        for outcome in scheduler.take_outcomes():
            assert isinstance(outcome, Dispatched)
            usage = UsageObservation(prompt_tokens=500, completion_tokens=10)
            scheduler.complete(now, outcome.dispatch, success=True, usage=usage)
        scheduler.take_outcomes()
    return scheduler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=50_000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    started = time.perf_counter()
    scheduler = build(args.programs, args.ranks)
    print(f"{args.programs} Programs over {args.ranks} Ranks built in {time.perf_counter() - started:.1f} s")
    print(f"{'page':>12} {'programs':>9} {'best ms':>8} {'median ms':>10} {'bytes':>11}")
    now = args.programs * 0.001 + 1.0
    pages: list[tuple[str, dict[str, int]]] = [
        ("default", {}),
        ("limit=5000", {"limit": 5000}),
        ("offset=40000", {"offset": 40000}),
    ]
    for label, page in pages:
        times: list[float] = []
        size = listed = 0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            snapshot = scheduler.diagnostics(now, **page)
            size = len(json.dumps(snapshot))
            times.append((time.perf_counter() - t0) * 1000)
            listed = sum(len(rank["programs"]) for rank in snapshot["ranks"])
        print(f"{label:>12} {listed:>9} {min(times):>8.1f} {statistics.median(times):>10.1f} {size:>11,}")


if __name__ == "__main__":
    main()
