"""Speed-ups of the engine and the simulator change no figure: seeded small runs under KV pressure (evictions,
preemptions, a blocked queue; native, Program-capacity and unbounded-KV arms; 256- and 64-token blocks) give
exactly the facts they gave before the fleet-size speed work of issue 13 part 3 (every request's status,
times to the bit, token counts and Rank, hashed), and the same headline figures.

The expectations were computed by the code before that work; a change that moves them on purpose says so in
its commit and recomputes them with ``reference_figures`` below.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest
from tests.sim.test_fleet import FLEET, SMALL, simulate

from progrouter.sim.simulation import ArmResult
from progrouter.workload.agentic import generate_agentic

pytestmark = pytest.mark.timeout(120)

#: (arm, block size) → (requests, token hit, preemptions, digest of every fact)
EXPECTED: dict[tuple[str, int], tuple[int, float, float, str]] = {
    ("native", 256): (199, 0.6420171208052258, 8.0, "50510c380ec7bf77"),
    ("capacity", 256): (199, 0.6345062389239845, 2.0, "139c011306eaa872"),
    ("oracle", 256): (200, 0.858757190914527, 0.0, "285c97d7cd13ce47"),
    ("native", 64): (199, 0.6379147097776999, 7.0, "ecadf7a16a5c2952"),
}


def digest(result: ArmResult) -> str:
    rows = sorted(
        (f.request_id, f.status, f.status_code, f.headers_at, f.first_token_at, f.finished_at,
         f.prompt_tokens, f.cached_tokens, f.output_tokens, f.rank)
        for f in result.facts
    )  # fmt: skip
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def reference_figures(arm: str, block_size: int) -> tuple[int, float, float, str]:
    trace = generate_agentic(replace(SMALL, block_size=block_size))
    fleet = replace(FLEET, block_size=block_size, num_blocks=FLEET.capacity_tokens // block_size)
    result = simulate(trace, fleet, arm)
    hit, preemptions = result.figures.get("token_cache_hit"), result.figures.get("preemptions")
    assert isinstance(hit, float) and isinstance(preemptions, float)
    return len(result.facts), hit, preemptions, digest(result)


@pytest.mark.parametrize(("arm", "block_size"), list(EXPECTED))
def test_a_seeded_run_gives_the_reference_figures(arm: str, block_size: int) -> None:
    assert reference_figures(arm, block_size) == EXPECTED[(arm, block_size)]
