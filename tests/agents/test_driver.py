"""The Program driver on a fake clock: outcomes reach their waiters, nothing taken holds capacity, ticks come
at the interval and at deadlines."""

from __future__ import annotations

from typing import Any

from progrouter.agents.driver import ProgramDriver
from progrouter.config import ProgramSchedulingConfig
from progrouter.program import (
    Dispatched,
    Outcome,
    ProgramIdentity,
    ProgramRequest,
    ProgramScheduler,
    RequestHints,
)
from progrouter.routing.target import Target

POOL = "program:model:m"
INTERVAL = 1.0


def request(program_id: str, context: int = 100) -> ProgramRequest:
    identity = ProgramIdentity(
        program_id=program_id,
        placement_key=program_id,
        placement_hash_key=f"header:x-session-id:{program_id}",
    )
    return ProgramRequest(identity, RequestHints(), POOL, context)


class Shell:
    """What a shell keeps: the outcomes handed to it, whether it still takes them, how often it re-armed."""

    def __init__(self, **config: Any) -> None:
        settings = ProgramSchedulingConfig(metrics_interval_seconds=INTERVAL, **config)
        self.scheduler = ProgramScheduler(settings)
        self.scheduler.set_ranks(POOL, [Target.parse("http://w:1@0")], 0.0)
        self.handed: list[tuple[str, Outcome]] = []
        self.takes = True
        self.rearmed = 0
        self.reports = 0
        self.driver: ProgramDriver[str] = ProgramDriver(
            self.scheduler, INTERVAL, self.hand, residency=self.residency, rearm=self.rearm
        )
        self.driver.start(0.0)

    def hand(self, waiter: str, outcome: Outcome) -> bool:
        if self.takes:
            self.handed.append((waiter, outcome))
        return self.takes

    def residency(self) -> None:
        self.reports += 1
        return None

    def rearm(self) -> None:
        self.rearmed += 1

    def holdings(self, now: float) -> tuple[int, int]:
        ranks = self.scheduler.diagnostics(now)["ranks"]
        return (
            sum(int(r["router_ledger_tokens"]) for r in ranks),
            sum(int(r["router_active_programs"]) for r in ranks),
        )


def test_a_dispatch_reaches_its_waiter_before_arrive_returns() -> None:
    shell = Shell()
    handle = shell.driver.arrive(0.0, request("a"), "waiter-a")
    assert [(w, type(o)) for w, o in shell.handed] == [("waiter-a", Dispatched)]
    assert shell.handed[0][1].handle == handle
    assert shell.driver.waiters == {}
    assert shell.rearmed >= 1  # every drain tells the shell its deadlines may have moved


def test_a_dispatch_nobody_takes_is_completed_as_failed_and_holds_nothing() -> None:
    shell = Shell()
    shell.takes = False  # the client left between arrival and dispatch
    shell.driver.arrive(0.0, request("a"), "waiter-a")
    assert shell.handed == []
    assert shell.holdings(0.0) == (0, 0)


def test_a_taken_dispatch_holds_its_rank_until_completed() -> None:
    shell = Shell()
    shell.driver.arrive(0.0, request("a"), "waiter-a")
    outcome = shell.handed[0][1]
    assert isinstance(outcome, Dispatched)
    assert shell.holdings(0.0)[1] == 1
    shell.driver.complete(1.0, outcome.dispatch, success=False, usage=None)
    assert shell.holdings(1.0) == (0, 0)


def test_a_waiting_request_is_handed_its_outcome_at_its_deadline() -> None:
    shell = Shell(
        max_active_programs_per_target=1, queue_timeout_seconds=5.0, force_resume_timeout_seconds=4.0
    )
    shell.driver.arrive(0.0, request("a"), "waiter-a")
    shell.driver.arrive(0.0, request("b"), "waiter-b")  # waits: the Rank holds one Active Program
    assert [w for w, _ in shell.handed] == ["waiter-a"]
    deadline = shell.driver.deadline_before(float("inf"))
    assert deadline is not None and 0.0 < deadline <= 5.0
    assert shell.driver.deadline_before(deadline) is None  # armed at it already: no earlier wake-up
    assert shell.driver.wake_at() == min(INTERVAL, deadline)
    shell.driver.tick(deadline - 0.01)
    assert [w for w, _ in shell.handed] == ["waiter-a"]
    shell.driver.tick(deadline)  # force resume (4 s) or the queue timeout (5 s): b is answered either way
    assert [w for w, _ in shell.handed] == ["waiter-a", "waiter-b"]
    assert shell.driver.last_tick == deadline
    assert shell.driver.waiters == {}


def test_a_withdrawn_waiter_is_handed_nothing() -> None:
    shell = Shell(
        max_active_programs_per_target=1, queue_timeout_seconds=5.0, force_resume_timeout_seconds=4.0
    )
    shell.driver.arrive(0.0, request("a"), "waiter-a")
    handle = shell.driver.arrive(0.0, request("b"), "waiter-b")
    shell.driver.withdraw(1.0, handle)
    shell.driver.drain(1.0)
    shell.driver.tick(6.0)
    assert [w for w, _ in shell.handed] == ["waiter-a"]


def test_wake_is_the_periodic_tick_once_due_and_a_deadline_tick_before() -> None:
    shell = Shell()
    shell.driver.wake(0.5)  # before the first periodic tick: a deadline's tick, no residency report
    assert (shell.reports, shell.driver.last_tick, shell.driver.next_tick) == (0, 0.5, INTERVAL)
    shell.driver.wake(1.25)
    assert (shell.reports, shell.driver.last_tick, shell.driver.next_tick) == (1, 1.25, 1.25 + INTERVAL)
    assert shell.driver.wake_at() == 1.25 + INTERVAL  # nothing waits: the next periodic tick
