"""``bench/fleet_sim.py`` with the agents spread evenly over the Ranks (issue 13's "moderate load with even
placement").

Consistent hashing places sessions unevenly: with 16 agents on 4 Ranks one Rank often holds six and another
two, and a Program router that moves waiters off the crowded Rank wins against native routing for that reason
alone. Here every session is renamed (its task id, and with it its Programs' ids) so that consistent hashing
sends the k-th session of the trace to Rank k mod N. Native routing hashes ``x-session-id`` (the task) and the
Program scheduler's default binding hashes the same key on a ring of the same shape, so every arm, the
spec's default config included, starts each session on the same Rank, four Ranks get sessions in turn, and
nothing else changes: a session keeps its requests, gaps and prompts (the block keys are the same trace
blocks under new names). The sessions that replace finished ones (``--reserve``) also come in turn, so the
live sessions per Rank drift a little as sessions end at different times (the figures' Programs per Rank
show it). Options and output are ``fleet_sim.py``'s.

    nice -n 10 .venv/bin/python bench/even_placement.py --profile h200-qwen-32b --ranks 4 --hours 0.5 \\
        --agents-per-rank 4 --seeds 0,1,2,3,4 --arms native,program,capacity,oracle
"""

from __future__ import annotations

from dataclasses import replace

import fleet_sim
from progrouter.routing.policies import ConsistentHashPolicy, RoutingRequest
from progrouter.routing.target import expand_targets
from progrouter.sim.ranks import SIM_ENGINE_URL, FleetSpec
from progrouter.workload.trace import Trace, TraceTask, program_id


def rank_of(session: str, ranks: int) -> int:
    """The Rank consistent hashing gives a session in the simulator (native's policy, native's key)."""
    targets = expand_targets([SIM_ENGINE_URL], ranks)
    request = RoutingRequest({"x-session-id": session}, None, b"")
    return ConsistentHashPolicy().select(targets, request).rank


def renamed(task: TraceTask, name: str) -> TraceTask:
    """``task`` as session ``name``: its Programs' ids (``<task>:<agent>``) and parents follow."""
    old = {p.program_id: program_id(name, p.agent_id) for p in task.programs}
    programs = tuple(
        replace(
            p,
            program_id=old[p.program_id],
            parent_program_id=None if p.parent_program_id is None else old[p.parent_program_id],
        )
        for p in task.programs
    )
    return replace(task, task_id=name, programs=programs)


def spread(trace: Trace, ranks: int) -> Trace:
    """The trace with the k-th session renamed to the first ``<task>.<n>`` hashing to Rank k mod ``ranks``."""
    tasks = []
    for k, task in enumerate(trace.tasks):
        n = 0
        while rank_of(f"{task.task_id}.{n}", ranks) != k % ranks:
            n += 1
        tasks.append(renamed(task, f"{task.task_id}.{n}"))
    return replace(trace, tasks=tuple(tasks))


def build_spread_trace(agents: int, seed: int, reserve: float, fleet: FleetSpec) -> Trace:
    return spread(fleet_sim.build_trace(agents, seed, reserve, fleet), fleet.ranks)


if __name__ == "__main__":
    fleet_sim.main(build_spread_trace)
