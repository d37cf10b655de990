"""The simulated fleet: one ``EngineCore`` per Rank, stepped on the virtual clock.

A Rank steps while it has work. ``EngineCore.step(t)`` runs the step that starts at ``t`` and returns its
end; the step's outputs (first tokens, finished requests) are delivered at that end, and the next step starts
no earlier (``next_event_time``). Requests added while a step runs join the next one, as in the emulator
server. What the scheduler observes of a Rank is exactly what the emulator's ``/metrics`` would report at that
instant (``vllm:kv_cache_usage_perc``, ``num_requests_running``, ``num_requests_waiting``), and the report
reads the Ranks' counters through the emulator's own exposition, so the live bench and the simulator parse
the same text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from progrouter.config import DecodeThroughputModel, PrefillCostModel
from progrouter.engine import (
    EngineConfig,
    EngineCore,
    PromptBlocks,
    RequestOutput,
    SamplingParams,
    StepResult,
)
from progrouter.engine.core import PlainRun
from progrouter.engine.metrics import render_metrics
from progrouter.program import BackendObservation
from progrouter.routing.target import Target, expand_targets
from progrouter.sim.clock import VirtualClock
from progrouter.workload.report import Sample, parse_metrics

#: The base URL of the simulated engine; Ranks are ``http://sim@0`` … (one engine, DP size N).
SIM_ENGINE_URL = "http://sim"

#: Hears each request's first token and its finish (the outputs in between only count tokens).
OutputHandler = Callable[["SimRank", RequestOutput, float], None]


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """The simulated Ranks: how many, and each one's KV cache and batch limits."""

    ranks: int = 2
    num_blocks: int = 4096
    block_size: int = 64
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None  # default: the whole KV cache of a Rank
    prefill_cost_model: PrefillCostModel = field(default_factory=PrefillCostModel)
    decode_throughput_model: DecodeThroughputModel = field(default_factory=DecodeThroughputModel)
    plain_runs: bool = True  # plain steps as one event (same results; False: one event per step)

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def engine_config(self, num_blocks: int | None = None) -> EngineConfig:
        blocks = self.num_blocks if num_blocks is None else num_blocks
        return EngineConfig(
            data_parallel_size=self.ranks,
            num_blocks=blocks,
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len or blocks * self.block_size,
            prefill_cost_model=self.prefill_cost_model,
            decode_throughput_model=self.decode_throughput_model,
        )


class SimRank:
    """One Rank: its target, its core, and whether a step (or a plain run) is scheduled.

    When the core's next steps are plain (``EngineCore.plain_run``: decodes and one prefill's chunks) the
    Rank schedules their end as one event instead of one per step. A request that arrives meanwhile and could
    be admitted before the run ends cuts the run: the steps that started before it are applied and the Rank
    steps on from the end of the last one (where the request joins), exactly as if the run had been stepped
    one by one. One that could not (the run's prefill takes the whole budget, the batch is full, or others
    wait ahead of it) just joins the queue, and an observation reads the KV of the steps begun so far without
    cutting: the run goes on, as stepping would.
    """

    __slots__ = ("_clock", "_on_output", "_run", "_run_seq", "core", "plain_runs", "stepping", "target")

    def __init__(
        self,
        target: Target,
        core: EngineCore,
        clock: VirtualClock,
        on_output: OutputHandler,
        *,
        plain_runs: bool = True,
    ):
        self.target = target
        self.core = core
        self.stepping = False
        self.plain_runs = plain_runs
        self._clock = clock
        self._on_output = on_output
        self._run: PlainRun | None = None
        self._run_seq = 0  # the pending run's end event carries this; a cut run's event is stale

    def add(
        self, request_id: str, prompt: Sequence[int] | PromptBlocks, output_tokens: int, now: float
    ) -> None:
        """Queue a request (exactly ``output_tokens`` long) and make sure the Rank steps."""
        params = SamplingParams(max_tokens=output_tokens, min_tokens=output_tokens, ignore_eos=True)
        if self._run is not None and self.core.scheduler.admits_during_run(self._run.chunk):
            self._cut(now)
        self.core.add_request(request_id, prompt, params, now)
        if not self.stepping:
            self.stepping = True
            self._clock.at(now, self._step)

    def _step(self, _: object) -> None:
        now = self._clock.now
        if self.plain_runs:
            run = self.core.plain_run(now)
            if run is not None:
                self._run = run
                self._run_seq += 1
                _, end = self.core.plain_run_steps(run)
                self._clock.at(end, self._run_over, self._run_seq)
                return
        result = self.core.step(now)
        if result.num_scheduled_tokens == 0:
            # Nothing could run: an empty Rank admits any request that fits its KV, so it is idle.
            self.stepping = False
            return
        self._clock.at(result.end, self._deliver, result)

    def _cut(self, now: float) -> None:
        """Apply the pending run's steps that started before ``now`` and step on from the last one's end."""
        if self._run is not None:
            end = self.core.finish_plain_run(self._run, before=now)
            self._run = None
            self._run_seq += 1
            self._clock.at(end, self._step)

    def _run_over(self, seq: int) -> None:
        if seq != self._run_seq or self._run is None:
            return  # cut by an arrival; the Rank already stepped on
        self.core.finish_plain_run(self._run)
        self._run = None
        self._step(None)

    def _deliver(self, result: StepResult) -> None:
        now = self._clock.now
        for output in result.outputs:
            if output.first_token or output.finish_reason is not None:  # a decode token in between: no news
                self._on_output(self, output, now)
        when = self.core.next_event_time()
        if when is None:
            self.stepping = False
        else:
            self._clock.soon(when, self._step)

    def observation(self) -> BackendObservation:
        """What ``/metrics`` would show now: the KV the steps begun so far hold (a pending run goes on), and
        the Rank's KV size (``vllm:cache_config_info``)."""
        core, run = self.core, self._run
        usage = core.kv_cache_usage() if run is None else core.plain_run_usage(run, self._clock.now)
        size = core.config.num_blocks * core.config.block_size
        return BackendObservation(usage, core.num_running, core.num_waiting, kv_capacity_tokens=size)


def build_fleet(
    spec: FleetSpec, clock: VirtualClock, on_output: OutputHandler, *, num_blocks: int | None = None
) -> list[SimRank]:
    config = spec.engine_config(num_blocks)
    targets = expand_targets([SIM_ENGINE_URL], spec.ranks)
    return [
        SimRank(t, EngineCore(config, rank=t.rank), clock, on_output, plain_runs=spec.plain_runs)
        for t in targets
    ]


def scrape(ranks: Sequence[SimRank]) -> list[Sample]:
    """The Ranks' ``/metrics`` as the live bench scrapes and parses it (source = the engine URL)."""
    if not ranks:
        return []
    model = ranks[0].core.config.model_name
    text = render_metrics([r.core for r in ranks], model).decode()
    return parse_metrics(text, SIM_ENGINE_URL)
