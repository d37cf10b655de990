"""The routing arms as the simulator drives them: native policies, and the Program scheduler's shell.

``NativeRouter`` sends each request at once to the Rank a request-level policy picks (``consistent_hash`` on
the ``x-session-id`` header the replay sends, or ``round_robin``). ``ProgramRouter`` is the virtual-time twin
of ``server/gate/program_gate.py`` on the same ``ProgramDriver`` (agents/driver.py): it builds the request's
identity from the same ``agentic_context`` the replay sends, and the driver, with the virtual ``now``, drains
outcomes after every call and ticks every ``metrics_interval_seconds`` and at ``next_deadline()``; the Ranks
are observed on the same interval once Program traffic exists.

Where it differs from the live gate, on purpose: the prompt-size estimate is the trace's exact input tokens
(the live gate learns a tokens-per-byte coefficient), and a scrape takes no time (``begin_observation`` and
``apply_observations`` happen at the same instant), and each Rank's KV size is known from the start (under
``"token_capacity_per_dp_rank": "auto"``; live, the first scrape after Program traffic begins reports it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from progrouter.agents.driver import ProgramDriver
from progrouter.agents.identity import extract_identity
from progrouter.config import ProgramSchedulingConfig
from progrouter.engine import RequestOutput
from progrouter.program import (
    BackendObservation,
    Dispatched,
    Outcome,
    PoolFull,
    ProgramRequest,
    ProgramScheduler,
    RecordingObserver,
    ResidencyReport,
    UsageObservation,
)
from progrouter.routing.policies import RoutingPolicy, RoutingRequest
from progrouter.routing.target import Target
from progrouter.sim.clock import VirtualClock
from progrouter.sim.requests import SimRequest
from progrouter.sim.residency import SimResidency
from progrouter.workload.context import agentic_context

Dispatch = Callable[[SimRequest, Target], None]
Reject = Callable[[SimRequest, int, str], None]
#: A request's ``kv_retention_ttl_seconds`` hint, from its trace position (None: send no hint).
HintFor = Callable[[SimRequest], float | None]
#: The model the simulated engine serves; a request naming it joins this Program model pool, as live.
MODEL = "progrouter-emulated"
MODEL_POOL = f"program:model:{MODEL}"


def session_headers(request: SimRequest) -> dict[str, str]:
    """What the replay sends besides the body: the task as ``x-session-id``."""
    return {"x-session-id": request.task.task_id}


class Router(Protocol):
    def start(self, now: float) -> None: ...

    def submit(self, now: float, request: SimRequest) -> None: ...

    def finished(self, now: float, request: SimRequest, output: RequestOutput | None) -> None:
        """A dispatched request ended: ``output`` is its last output, None when the engine refused it."""


class NativeRouter:
    """A request-level policy over all Ranks; no retention, no admission."""

    def __init__(self, policy: RoutingPolicy, targets: Sequence[Target], dispatch: Dispatch) -> None:
        self.policy = policy
        self.targets = sorted(targets)
        self._dispatch = dispatch

    def start(self, now: float) -> None:
        return None

    def submit(self, now: float, request: SimRequest) -> None:
        target = self.policy.select(self.targets, RoutingRequest(session_headers(request), None, b""))
        self.policy.on_start(target)
        self._dispatch(request, target)

    def finished(self, now: float, request: SimRequest, output: RequestOutput | None) -> None:
        assert request.target is not None
        self.policy.on_finish(request.target)


class ProgramRouter:
    """The Program scheduler, fed in virtual time."""

    def __init__(
        self,
        config: ProgramSchedulingConfig,
        targets: Sequence[Target],
        clock: VirtualClock,
        observe: Callable[[Sequence[Target]], Mapping[str, BackendObservation]],
        dispatch: Dispatch,
        reject: Reject,
        hint_for: HintFor,
        finished: Callable[[], bool],
    ) -> None:
        self.config = config
        self.observer = RecordingObserver()
        self.scheduler = ProgramScheduler(config, observer=self.observer)
        self.targets = sorted(targets)
        self._clock = clock
        self._observe = observe
        self._dispatch = dispatch
        self._reject = reject
        self._hint_for = hint_for
        self._finished = finished
        self._deadline_at: float | None = None
        self._max_hint = 0.0
        self.settled_at: float | None = None
        self.drain_until: float | None = None
        self.residency: SimResidency | None = None  # residency_aware arms: the Ranks' block pools
        self.driver: ProgramDriver[SimRequest] = ProgramDriver(
            self.scheduler,
            config.metrics_interval_seconds,
            self._hand,
            residency=self._residency_reports,
            rearm=self._arm_deadline,
        )

    # ------------------------------------------------------------------------------------------ driving
    def start(self, now: float) -> None:
        self.scheduler.set_ranks(MODEL_POOL, self.targets, now)
        for target_id, observation in self._observe(self.targets).items():  # each worker's KV size, at join
            if observation.kv_capacity_tokens is not None:
                self.scheduler.report_kv_capacity(now, target_id, observation.kv_capacity_tokens)
        self.driver.start(now)
        self._clock.at(self.driver.next_tick, self._periodic)

    def _periodic(self, _: object) -> None:
        now = self._clock.now
        tracked = self.scheduler.tracked_ranks()
        if tracked:
            epoch = self.driver.begin_observation(now)
            self.driver.apply_observations(now, epoch, self._observe(tracked))
        self.driver.periodic(now)
        if not self._settled(now):
            self._clock.at(self.driver.next_tick, self._periodic)

    def _residency_reports(self) -> Mapping[tuple[str, str], ResidencyReport] | None:
        return None if self.residency is None else self.residency.report()

    def _on_deadline(self, when: float) -> None:
        if when != self._deadline_at:
            return  # superseded by an earlier deadline, which re-armed this one if still due
        self._deadline_at = None
        if self.settled_at is None:
            self.driver.tick(self._clock.now)

    def _arm_deadline(self) -> None:
        if self.settled_at is not None:
            return
        armed = float("inf") if self._deadline_at is None else self._deadline_at
        deadline = self.driver.deadline_before(armed)
        if deadline is not None:
            self._deadline_at = deadline
            self._clock.at(deadline, self._on_deadline, deadline)

    def _settled(self, now: float) -> bool:
        """After the last task: stop once no Program holds capacity (or the drain horizon has passed)."""
        if self.settled_at is not None:
            return True
        if not self._finished():
            return False
        config = self.config
        if self.drain_until is None:
            ttl = max(config.max_acting_ttl_seconds, self._max_hint)
            self.drain_until = now + ttl + 10 * config.metrics_interval_seconds
        ledger, active = self.holdings()
        if (ledger == 0 and active == 0) or now >= self.drain_until:
            self.settled_at = now
            return True
        return False

    # ----------------------------------------------------------------------------------------- requests
    def submit(self, now: float, request: SimRequest) -> None:
        found = extract_identity(
            self._body(request),
            session_headers(request),
            self.config.program_scheduling_enable_key,
            raw_body=b"",
            model_pool=MODEL_POOL,
        )
        if found is None:
            raise AssertionError("the simulated request carries no Program identity")
        program_request = ProgramRequest(
            identity=found.identity,
            hints=found.hints,
            model_pool=MODEL_POOL,
            estimated_context_tokens=request.request.input_tokens,
            residency=None
            if self.residency is None
            else self.residency.arrival((MODEL_POOL, found.identity.program_id), request),
        )
        try:
            request.handle = self.driver.arrive(now, program_request, request)
        except PoolFull as exc:  # as the live gate: 429, and the agent goes on
            self._reject(request, 429, str(exc))

    def _body(self, request: SimRequest) -> dict[str, Any]:
        hint = self._hint_for(request)
        if hint is not None:
            self._max_hint = max(self._max_hint, hint)
        context = agentic_context(request.task, request.program, request.step, request.request_id, hint)
        return {"model": MODEL, "vllm_xargs": {"agentic_context": context}}

    def finished(self, now: float, request: SimRequest, output: RequestOutput | None) -> None:
        dispatch = request.dispatch
        assert dispatch is not None
        if output is None:
            self.driver.complete(now, dispatch, success=False, usage=None)
        else:
            fact = request.fact
            decode = None if fact.first_token_at is None else now - fact.first_token_at
            usage = UsageObservation(
                prompt_tokens=output.num_prompt_tokens,
                completion_tokens=output.num_output_tokens,
                cached_tokens=output.num_cached_tokens,
            )
            self.driver.complete(now, dispatch, success=True, usage=usage, decode_seconds=decode)

    def _hand(self, request: SimRequest, outcome: Outcome) -> bool:
        """Send a dispatched request to its Rank; answer a timed-out one with 429."""
        if isinstance(outcome, Dispatched):
            request.dispatch = outcome.dispatch
            self._dispatch(request, outcome.dispatch.target)
        else:
            self._reject(request, 429, "Program request exceeded its admission queue timeout")
        return True

    # ------------------------------------------------------------------------------------------ reading
    def diagnostics(self) -> dict[str, Any]:
        return self.scheduler.diagnostics(self._clock.now)

    def holdings(self) -> tuple[int, int]:
        """(ledger tokens, Active Programs) summed over the Ranks: both zero once every Program let go."""
        ranks = self.diagnostics()["ranks"]
        return (
            sum(int(r["router_ledger_tokens"]) for r in ranks),
            sum(int(r["router_active_programs"]) for r in ranks),
        )
