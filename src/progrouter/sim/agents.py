"""The trace's agents, closed loop on the virtual clock — the same rules as ``workload.replay``.

Each Program sends request *i+1* once request *i* has completed and its gap has passed. A subagent starts
when the parent request it was spawned after completes (``spawn_after = -1``: when the parent starts) and
runs concurrently with everything else; a parent's next request also waits for every blocking subagent
spawned before it. A Program is finished when its last request and all its subagents are; a task when its
lead is. Requests go out through ``send`` and come back through ``ProgramRun.request_done``.

``max_concurrent_tasks`` is the replay's task slots (its ``asyncio.Semaphore``): a task that reached its
``start`` waits for a free slot, FIFO in the order tasks reached their start (trace order on ties); a slot
frees when a task finishes, and the next waiting task starts at that instant. A task's JCT counts from when it
actually started (``task_start``), as the replay's facts do.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from progrouter.sim.clock import VirtualClock
from progrouter.workload.trace import Trace, TraceProgram, TraceTask

Send = Callable[["ProgramRun", int], None]


class ProgramRun:
    """The closed loop of one Program of one task."""

    __slots__ = (
        "_agents",
        "blocking",
        "finished",
        "gap_passed",
        "live_children",
        "next_step",
        "parent",
        "prev_done",
        "program",
        "task",
    )

    def __init__(
        self, agents: Agents, task: TraceTask, program: TraceProgram, parent: ProgramRun | None
    ) -> None:
        self._agents = agents
        self.task = task
        self.program = program
        self.parent = parent
        self.next_step = 0
        self.prev_done = 0.0
        self.gap_passed = False
        self.blocking = 0  # blocking subagents the next request still waits for
        self.live_children = 0
        self.finished = False

    def start(self, now: float) -> None:
        self._spawn(-1, now)
        self.prev_done = now
        self._wait_gap()

    def request_done(self, now: float) -> None:
        """The request in flight completed (or failed) at ``now``."""
        step = self.next_step
        self.prev_done = now
        self.next_step += 1
        self._spawn(step, now)
        self._wait_gap()

    def _wait_gap(self) -> None:
        requests = self.program.requests
        if self.next_step >= len(requests):
            self._maybe_finish()
            return
        clock = self._agents.clock
        clock.at(self.prev_done + requests[self.next_step].gap, self._gap_over)

    def _gap_over(self, _: object) -> None:
        self.gap_passed = True
        self._try_send()

    def _try_send(self) -> None:
        if self.gap_passed and self.blocking == 0 and self.next_step < len(self.program.requests):
            self.gap_passed = False
            self._agents.send(self, self.next_step)

    def _spawn(self, after: int, now: float) -> None:
        for child in self._agents.children(self.task, self.program.program_id):
            if child.spawn_after != after:
                continue
            self.live_children += 1
            if child.blocks_parent:
                self.blocking += 1
            ProgramRun(self._agents, self.task, child, self).start(now)

    def _child_finished(self, child: ProgramRun) -> None:
        self.live_children -= 1
        if child.program.blocks_parent:
            self.blocking -= 1
            self._try_send()
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self.finished or self.next_step < len(self.program.requests) or self.live_children:
            return
        self.finished = True
        if self.parent is not None:
            self.parent._child_finished(self)
        else:
            self._agents.task_finished(self.task)


class Agents:
    """Starts every task at its ``start`` (or, with ``max_concurrent_tasks``, when a slot frees after that)
    and tracks how many are still running or waiting."""

    def __init__(
        self, trace: Trace, clock: VirtualClock, send: Send, *, max_concurrent_tasks: int | None = None
    ) -> None:
        if max_concurrent_tasks is not None and max_concurrent_tasks < 1:
            raise ValueError(f"max_concurrent_tasks must be at least 1, got {max_concurrent_tasks}")
        self.trace = trace
        self.clock = clock
        self.send = send
        self.running_tasks = 0  # started or waiting for a slot, not finished
        self.task_start: dict[str, float] = {}  # when each task actually started
        self._free_slots = max_concurrent_tasks  # None: unlimited
        self._waiting: deque[TraceTask] = deque()
        self._children: dict[tuple[str, str], list[TraceProgram]] = {}
        for task in trace.tasks:
            for p in task.programs:
                if p.parent_program_id is not None:
                    self._children.setdefault((task.task_id, p.parent_program_id), []).append(p)

    def start(self) -> None:
        for task in self.trace.tasks:
            self.running_tasks += 1
            self.clock.at(task.start, self._task_ready, task)

    def _task_ready(self, task: TraceTask) -> None:
        self._waiting.append(task)
        self._start_waiting()

    def _start_waiting(self) -> None:
        while self._waiting and (self._free_slots is None or self._free_slots > 0):
            if self._free_slots is not None:
                self._free_slots -= 1
            task = self._waiting.popleft()
            now = self.clock.now
            self.task_start[task.task_id] = now
            ProgramRun(self, task, task.lead, None).start(now)

    def children(self, task: TraceTask, program_id: str) -> list[TraceProgram]:
        return self._children.get((task.task_id, program_id), [])

    def task_finished(self, task: TraceTask) -> None:
        self.running_tasks -= 1
        if self._free_slots is not None:
            self._free_slots += 1
            self._start_waiting()

    @property
    def done(self) -> bool:
        return self.running_tasks == 0
