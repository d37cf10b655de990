"""One simulated client request: what the trace asked for, where it went, and its replay fact."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from progrouter.program import ProgramDispatch, RequestHandle
from progrouter.routing.target import Target
from progrouter.workload.facts import Fact
from progrouter.workload.trace import TraceProgram, TraceRequest, TraceTask

if TYPE_CHECKING:
    from progrouter.sim.agents import ProgramRun


@dataclass(slots=True)
class SimRequest:
    request_id: str
    task: TraceTask
    program: TraceProgram
    step: int
    request: TraceRequest
    run: ProgramRun
    fact: Fact
    target: Target | None = None
    handle: RequestHandle | None = None
    dispatch: ProgramDispatch | None = None
