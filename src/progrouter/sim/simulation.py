"""One arm, one trace, one cold fleet, in virtual time: the discrete-event simulation itself.

Wiring: the agents (closed loop per Program) send requests to the arm's router; the router dispatches them to
Ranks (at once for a native policy, when the Program scheduler says so for a Program arm); each Rank's
``EngineCore`` steps on the virtual clock; a finished request reports its usage back to the router exactly
once and hands control back to its Program's loop. Every request leaves a replay ``Fact`` stamped in
virtual seconds (``time_scale`` 1) — sent, dispatched (``headers_at``, so time-to-headers is exactly the
router's queue wait), first token, finished — and the Ranks' counters are scraped cold and at the end, so
``workload.report.arm_figures`` computes every figure with the live bench's arithmetic.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from progrouter.config import Policy
from progrouter.engine import PromptBlocks, RequestOutput, RequestRejected
from progrouter.program import BackendObservation
from progrouter.routing.policies import ConsistentHashPolicy, RoundRobinPolicy, RoutingPolicy
from progrouter.routing.target import Target
from progrouter.sim.agents import Agents, ProgramRun
from progrouter.sim.arms import SimArm, hint_value
from progrouter.sim.clock import VirtualClock
from progrouter.sim.ranks import FleetSpec, SimRank, build_fleet, scrape
from progrouter.sim.requests import SimRequest
from progrouter.sim.residency import SimResidency
from progrouter.sim.routers import NativeRouter, ProgramRouter, Router
from progrouter.sim.summary import scheduler_summary, transition_samples
from progrouter.workload.arms import EngineFleet, oracle_blocks
from progrouter.workload.facts import Fact
from progrouter.workload.prompts import PromptBuilder
from progrouter.workload.report import ArmInputs, arm_figures, task_jct
from progrouter.workload.trace import Trace


@dataclass(slots=True)
class ArmResult:
    """What one simulated arm produced."""

    arm: SimArm
    facts: list[Fact]
    figures: dict[str, Any]
    scheduler: dict[str, Any] | None  # the Program arm's summary (transitions, TTLs, queue, ledger)
    diagnostics: dict[str, Any] | None  # the scheduler's §5.6 snapshot at the end
    num_blocks: int
    virtual_seconds: float  # when the last request finished
    events: int
    wall_seconds: float


def unbounded_blocks(trace: Trace, fleet: FleetSpec) -> int:
    """KV blocks per Rank that never evict on this trace (the bench's oracle sizing)."""
    return oracle_blocks(trace, EngineFleet(num_blocks=fleet.num_blocks, block_size=fleet.block_size))


class Simulation:
    def __init__(
        self,
        trace: Trace,
        fleet: FleetSpec,
        arm: SimArm,
        *,
        salt: str = "progrouter",
        max_concurrent_tasks: int | None = None,
        until: float | None = None,
    ) -> None:
        self.trace = trace
        self.until = until  # None: until every task finished; else stop at this virtual time
        self.fleet = fleet
        self.arm = arm
        self.clock = VirtualClock()
        self.num_blocks = unbounded_blocks(trace, fleet) if arm.unbounded_kv else fleet.num_blocks
        self.ranks = build_fleet(fleet, self.clock, self._on_output, num_blocks=self.num_blocks)
        self._by_target = {r.target.id: r for r in self.ranks}
        self.prompts = PromptBuilder(trace, salt=salt, vocab_size=self.ranks[0].core.config.vocab_size)
        self.agents = Agents(trace, self.clock, self._send, max_concurrent_tasks=max_concurrent_tasks)
        self.facts: list[Fact] = []
        self._in_flight: dict[str, SimRequest] = {}
        self.router: Router = self._router()
        if isinstance(self.router, ProgramRouter):
            self.router.residency = SimResidency.for_arm(arm.program, self.ranks, self._prompt)

    def _router(self) -> Router:
        arm = self.arm
        targets = [r.target for r in self.ranks]
        if arm.program is None:
            policy: RoutingPolicy = (
                RoundRobinPolicy() if arm.policy is Policy.ROUND_ROBIN else ConsistentHashPolicy()
            )
            return NativeRouter(policy, targets, self._dispatch)
        return ProgramRouter(
            arm.program,
            targets,
            self.clock,
            self._observe,
            self._dispatch,
            self._reject,
            lambda request: hint_value(arm.hint, request),
            lambda: self.agents.done,
        )

    # ------------------------------------------------------------------------------------------- running
    def run(self) -> ArmResult:
        started = time.perf_counter()
        before = scrape(self.ranks)
        self.advance()
        after = scrape(self.ranks)
        planned = {t.task_id: t.num_requests for t in self.trace.tasks}
        router_samples = []
        scheduler = diagnostics = None
        if isinstance(self.router, ProgramRouter):
            router_samples = transition_samples(self.router.observer)
            diagnostics = self.router.diagnostics()
            scheduler = scheduler_summary(self.router, diagnostics)
        figures = arm_figures(ArmInputs(self.facts, planned, before, after, router_samples))
        figures["jct_per_task"] = task_jct(self.facts, planned)
        return ArmResult(
            arm=self.arm,
            facts=self.facts,
            figures=figures,
            scheduler=scheduler,
            diagnostics=diagnostics,
            num_blocks=self.num_blocks,
            virtual_seconds=max((f.finished_at for f in self.facts), default=0.0),
            events=self.clock.events_run,
            wall_seconds=time.perf_counter() - started,
        )

    def advance(self) -> None:
        """Run the arm to its end (every task finished, or ``until``) without building its result: for a
        caller that reads the facts, Ranks and router itself (the fleet bench; the result's scrapes and
        scheduler summary cost it seconds at 2,000 agents)."""
        self.router.start(0.0)
        self.agents.start()
        self.clock.run(stop=lambda: False, until=math.inf if self.until is None else self.until)
        if self.until is None and not self.agents.done:
            raise RuntimeError(f"{self.agents.running_tasks} tasks never finished (a request was lost)")

    # ------------------------------------------------------------------------------------------- requests
    def _send(self, run: ProgramRun, step: int) -> None:
        now = self.clock.now
        task, program = run.task, run.program
        fact = Fact.start(
            task,
            program,
            step,
            task_start=self.agents.task_start[task.task_id],
            ready_at=now,
            started_at=now,
            finished_at=now,
        )
        request = SimRequest(fact.request_id, task, program, step, program.requests[step], run, fact)
        self.router.submit(now, request)

    def _dispatch(self, request: SimRequest, target: Target) -> None:
        now = self.clock.now
        request.target = target
        fact = request.fact
        fact.headers_at = now
        fact.rank = target.rank
        fact.target = target.id
        rank = self._by_target[target.id]
        prompt = self._prompt(request, rank.core.config.block_size)
        try:
            rank.add(request.request_id, prompt, request.request.output_tokens, now)
        except RequestRejected as exc:
            # Reported from its own event: the router may be in the middle of draining outcomes.
            self.clock.at(now, self._refused, (request, str(exc)))
            return
        self._in_flight[request.request_id] = request

    def _prompt(self, request: SimRequest, block_size: int) -> PromptBlocks | list[int]:
        """The prompt as block keys when the Rank's blocks are whole trace blocks (no tokens drawn or
        hashed: the same cache behaviour for a fraction of the time), else as token ids."""
        task_id, trace_request = request.task.task_id, request.request
        program_id = request.program.program_id
        hashes = self.prompts.block_hashes(program_id, task_id, request.request_id, trace_request, block_size)
        if hashes is not None:
            return PromptBlocks(trace_request.input_tokens, hashes)
        tokens: list[int] = self.prompts.token_ids(task_id, request.request_id, trace_request).tolist()
        return tokens

    def _refused(self, arg: tuple[SimRequest, str]) -> None:
        request, error = arg
        self._fail(request, 400, error)
        self.router.finished(self.clock.now, request, None)
        request.run.request_done(self.clock.now)

    def _reject(self, request: SimRequest, status: int, error: str) -> None:
        """The router answered without dispatching (queue timeout)."""
        self._fail(request, status, error)
        self.clock.at(self.clock.now, self._resume, request)

    def _resume(self, request: SimRequest) -> None:
        request.run.request_done(self.clock.now)

    def _fail(self, request: SimRequest, status: int, error: str) -> None:
        fact = request.fact
        fact.status = "error"
        fact.status_code = status
        fact.error = error
        fact.finished_at = self.clock.now
        self.facts.append(fact)

    def _on_output(self, rank: SimRank, output: RequestOutput, now: float) -> None:
        request = self._in_flight[output.request_id]
        fact = request.fact
        if output.first_token:
            fact.first_token_at = now
        if not output.finished:
            return
        del self._in_flight[output.request_id]
        fact.finished_at = now
        fact.status_code = 200
        fact.prompt_tokens = output.num_prompt_tokens
        fact.output_tokens = output.num_output_tokens
        fact.cached_tokens = output.num_cached_tokens
        self.facts.append(fact)
        self.router.finished(now, request, output)
        request.run.request_done(now)

    def programs_per_rank(self) -> list[int]:
        """How many Programs have a request on each Rank (running or waiting in its engine) right now."""
        per_rank: dict[str, set[str]] = {r.target.id: set() for r in self.ranks}
        for request in self._in_flight.values():
            if request.target is not None:
                per_rank[request.target.id].add(request.program.program_id)
        return [len(per_rank[r.target.id]) for r in self.ranks]

    def _observe(self, targets: Sequence[Target]) -> dict[str, BackendObservation]:
        return {t.id: self._by_target[t.id].observation() for t in targets}
