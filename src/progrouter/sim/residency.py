"""Residency-aware Program arms in the simulator: the reports the server's KV-event index gives the scheduler,
read straight from each simulated Rank's block pool.

Live, a Rank's ``BlockStored``/``BlockRemoved`` events say which blocks it holds; here the pool's prefix-cache
map is that set at every instant (no event lag, no silent Rank: every Rank is known). A Program's prompt is
remembered as its engine block hashes at arrival, sampled and bounded exactly as the server shell does
(``program.residency_prompts``), and the scheduler hears the same two reports: the request's own at arrival
and every Program's each ``metrics_interval_seconds``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from progrouter.agents.residency_prompts import ProgramKey, ProgramPrompts
from progrouter.config import ProgramSchedulingConfig
from progrouter.engine import PromptBlocks
from progrouter.engine.request import chain_hashes
from progrouter.program import RecordingObserver, ResidencyReport
from progrouter.sim.ranks import SimRank
from progrouter.sim.requests import SimRequest

#: The prompt a request sends its Rank (``Simulation._prompt``): block hashes, or token ids.
PromptOf = Callable[[SimRequest, int], PromptBlocks | list[int]]


def rules_fired(observer: RecordingObserver) -> dict[str, int]:
    """How often each residency rule changed a decision in a run (``residency_rule_total{rule}``)."""
    counters = observer.counters.items()
    return {dict(labels)["rule"]: int(n) for (name, labels), n in counters if name == "residency_rule_total"}


def block_hashes(prompt: PromptBlocks | list[int], block_size: int) -> Sequence[int]:
    """The engine's hashes of the prompt's full blocks (as ``engine.request.Request`` chains them)."""
    if isinstance(prompt, PromptBlocks):
        return prompt.block_hashes
    full = len(prompt) - len(prompt) % block_size
    return chain_hashes(tuple(prompt[i : i + block_size]) for i in range(0, full, block_size))


class SimResidency:
    """The simulated Ranks' residency, as reports for the scheduler."""

    def __init__(
        self, ranks: Sequence[SimRank], prompt_of: PromptOf, config: ProgramSchedulingConfig
    ) -> None:
        self._pools = {r.target.id: r.core.kv.pool for r in ranks}
        self._target_ids = sorted(self._pools)
        self.block_size = ranks[0].core.config.block_size
        self._prompt_of = prompt_of
        self._prompts = ProgramPrompts(
            self.block_size, config.max_paused_programs + config.max_pooled_requests
        )

    @classmethod
    def for_arm(
        cls, config: ProgramSchedulingConfig | None, ranks: Sequence[SimRank], prompt_of: PromptOf
    ) -> SimResidency | None:
        """Only a Program arm with ``residency_aware`` reads residency; every other arm runs as before."""
        return cls(ranks, prompt_of, config) if config is not None and config.residency_aware else None

    def match(self, target_id: str, keys: Sequence[int]) -> int:
        cached = self._pools[target_id].cached_map
        n = 0
        for key in keys:
            if key not in cached:
                break
            n += 1
        return n

    def arrival(self, key: ProgramKey, request: SimRequest) -> ResidencyReport:
        hashes = block_hashes(self._prompt_of(request, self.block_size), self.block_size)
        return self._prompts.arrival(key, hashes, self.match, self._target_ids)

    def report(self) -> dict[ProgramKey, ResidencyReport]:
        return self._prompts.report(self.match, self._target_ids)
