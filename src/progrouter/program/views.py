"""The narrow views event handlers take: each names the parts of the scheduler's state one family of
handlers reads, so a handler can reach nothing else.

``Core`` bundles every part (ledger, table, pool, queues, agenda, timers, ...); the scheduler passes it to
the handlers of lifecycle, resume, dispatch and binding, which declare one of these views instead. The views
are structural (``Protocol``): ``Core`` satisfies each as it is, nothing is built per event, and mypy fails
on a handler that reads a part its view does not name. Views are read-only (properties): a handler calls
the parts' own methods and cannot swap a part out.

    view          taken by                                                   adds
    RankSource    admission.rank_view, binding                               config, table, factors, ledger
    Pausing       lifecycle: pause, release, retention, acting TTL           + observer, timers, queues, ...
    Arriving      lifecycle.arrived                                          table, lineage, targets, ...
    Completing    lifecycle.complete                                         Pausing + agenda, ledger, pool
    Repairing     lifecycle.capacity_repair                                  Pausing + ledger, watermarks
    Queueing      resume: wait, enqueue, requeue, force timer                RankSource + pool, queues, ...
    Dispatching   dispatch, resume.commit_admission                          RankSource + pool, outcomes, ...
    Scheduling    resume.schedule_target, cross_rank_pass                    Dispatching + queues, agenda, ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from progrouter.config import ProgramSchedulingConfig
    from progrouter.program.agenda import Agenda
    from progrouter.program.binding import Binder
    from progrouter.program.factors import RankFactors
    from progrouter.program.ledger import CapacityLedger
    from progrouter.program.lineage import ProgramLineage
    from progrouter.program.observer import SchedulerObserver
    from progrouter.program.outcomes import Outcome, ProgramDispatch
    from progrouter.program.pool import RequestPool
    from progrouter.program.queues import RankQueues
    from progrouter.program.residency import ResidencyBook
    from progrouter.program.resume import ForceResumeWork
    from progrouter.program.state import Program, ProgramTable
    from progrouter.program.timers import Timers
    from progrouter.routing.target import Target


class RankSource(Protocol):
    """One Rank's admission facts: config, the table's per-Rank indexes, rolling statistics, the ledger."""

    @property
    def config(self) -> ProgramSchedulingConfig: ...
    @property
    def table(self) -> ProgramTable: ...
    @property
    def factors(self) -> dict[str, RankFactors]: ...
    @property
    def ledger(self) -> CapacityLedger: ...


class _Programs(Protocol):
    """The table, the idle Paused Programs, lineage, the observer and per-Rank statistics."""

    @property
    def table(self) -> ProgramTable: ...
    @property
    def observer(self) -> SchedulerObserver: ...
    @property
    def observing(self) -> bool: ...  # False: the observer is the no-op one, reporting may be skipped
    @property
    def debugging(self) -> bool: ...  # False: nobody keeps debug events now, building them is skipped
    @property
    def lineage(self) -> ProgramLineage: ...
    @property
    def paused_idle(self) -> dict[Program, None]: ...
    def rank_factors(self, target_id: str) -> RankFactors: ...


class Pausing(_Programs, Protocol):
    """Pausing, releasing, paused retention and the acting TTL."""

    @property
    def config(self) -> ProgramSchedulingConfig: ...
    @property
    def timers(self) -> Timers: ...
    @property
    def queues(self) -> RankQueues: ...
    @property
    def factors(self) -> dict[str, RankFactors]: ...


class Arriving(_Programs, Protocol):
    """A request arrives for a Program: its continuity sample, lineage and retention."""

    @property
    def targets(self) -> dict[str, Target]: ...


class Completing(Pausing, Protocol):
    """A completion: samples, rounds, recharging, then what the idle Program does (pause, TTL, yield)."""

    @property
    def agenda(self) -> Agenda: ...
    @property
    def ledger(self) -> CapacityLedger: ...
    @property
    def pool(self) -> RequestPool: ...


class Repairing(Pausing, Protocol):
    """Capacity repair of one Rank: its usage and watermarks, then pauses and marks."""

    @property
    def ledger(self) -> CapacityLedger: ...
    @property
    def high_tokens(self) -> float | None: ...
    @property
    def low_tokens(self) -> float | None: ...


class _Waiting(RankSource, Protocol):
    """The retained requests and the Rank queues."""

    @property
    def pool(self) -> RequestPool: ...
    @property
    def queues(self) -> RankQueues: ...


class Queueing(_Waiting, Protocol):
    """A waiting Program enters, moves in or leaves its Rank queue, with its force deadline."""

    @property
    def timers(self) -> Timers: ...
    @property
    def work(self) -> ForceResumeWork: ...
    @property
    def pool_targets(self) -> dict[str, list[str]]: ...


class Dispatching(_Waiting, Protocol):
    """An Active Program's requests go out (and, from resume, an admission is committed first)."""

    @property
    def observer(self) -> SchedulerObserver: ...
    @property
    def observing(self) -> bool: ...
    @property
    def debugging(self) -> bool: ...
    @property
    def targets(self) -> dict[str, Target]: ...
    @property
    def binder(self) -> Binder: ...
    @property
    def outstanding(self) -> dict[int, ProgramDispatch]: ...
    @property
    def outcomes(self) -> list[Outcome]: ...


class Scheduling(Dispatching, Protocol):
    """A scheduling pass over one Rank's queue, or across the Ranks of a pool."""

    @property
    def agenda(self) -> Agenda: ...
    @property
    def pool_targets(self) -> dict[str, list[str]]: ...
    @property
    def residency(self) -> ResidencyBook: ...  # residency_aware: the cross-Rank pass's residency rules
