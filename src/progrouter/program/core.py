"""The state one ``ProgramScheduler`` owns, in one place the policy modules share.

Accounting (``CapacityLedger``), state (``ProgramTable``), retained requests (``RequestPool``), Rank queues,
the work queue (``Agenda``), force-resume inputs, binding, timers and rolling statistics are separate
objects, each changed only through its own methods; this bundle only wires them together. Event handlers
declare the narrow view of it they read (``views.py``); decisions take narrower ones still (``RankView``, a
queue, a record).
"""

from __future__ import annotations

from progrouter.config import ProgramSchedulingConfig
from progrouter.program.agenda import Agenda
from progrouter.program.binding import Binder
from progrouter.program.factors import RankFactors
from progrouter.program.ledger import CapacityLedger
from progrouter.program.lineage import ProgramLineage
from progrouter.program.observer import NullObserver, SchedulerObserver
from progrouter.program.outcomes import Outcome, ProgramDispatch
from progrouter.program.pool import RequestPool
from progrouter.program.queues import RankQueues
from progrouter.program.residency import ResidencyBook
from progrouter.program.resume import ForceResumeWork
from progrouter.program.state import Program, ProgramTable
from progrouter.program.timers import Timers
from progrouter.routing.prefix_tree import CacheAwareIndex
from progrouter.routing.target import Target


class Core:
    __slots__ = (
        "agenda",
        "binder",
        "config",
        "debugging",
        "factors",
        "high_tokens",
        "ledger",
        "lineage",
        "low_tokens",
        "observer",
        "observing",
        "outcomes",
        "outstanding",
        "paused_idle",
        "pool",
        "pool_targets",
        "queues",
        "residency",
        "table",
        "target_pools",
        "targets",
        "timers",
        "tracked_pools",
        "work",
    )

    def __init__(
        self,
        config: ProgramSchedulingConfig,
        observer: SchedulerObserver,
        cache_index: CacheAwareIndex | None,
    ) -> None:
        self.config = config
        self.observer = observer
        # decided once: with the no-op observer the hot paths skip building metrics and events at all
        self.observing = type(observer) is not NullObserver
        self.debugging = False  # whether debug events are built at all (``attend``)
        self.attend()
        capacity = config.token_capacity_per_dp_rank
        self.low_tokens: float | None = None if capacity is None else capacity * config.low_watermark_ratio
        self.high_tokens: float | None = None if capacity is None else capacity * config.high_watermark_ratio
        self.pool = RequestPool()
        self.agenda = Agenda()
        self.ledger = CapacityLedger(capacity, config.metrics_interval_seconds, self.agenda)
        self.table = ProgramTable(
            self.ledger, self.pool, config.max_segment_rounds, config.max_paused_programs
        )
        self.queues = RankQueues(self.agenda, pool_order=config.global_queue)
        self.work = ForceResumeWork()
        self.binder = Binder(config, cache_index)
        self.timers = Timers()
        self.lineage = ProgramLineage()
        self.residency = ResidencyBook()  # residency.py's: what each Rank holds of each Program's prompt
        self.factors: dict[str, RankFactors] = {}
        self.pool_targets: dict[str, list[str]] = {}  # model pool -> sorted live target ids
        self.targets: dict[str, Target] = {}  # every live target id of any pool
        self.target_pools: dict[str, set[str]] = {}  # target id -> the pools it serves
        self.tracked_pools: set[str] = set()  # pools that have seen Program traffic
        self.outcomes: list[Outcome] = []
        self.outstanding: dict[int, ProgramDispatch] = {}  # handle id -> dispatch awaiting completion
        # idle Paused Programs, oldest first (lifecycle's): past max_paused_programs the oldest is released
        self.paused_idle: dict[Program, None] = {}

    def attend(self) -> None:
        """Ask the observer again whether it keeps debug events (its log level may have changed): at start
        and every tick."""
        self.debugging = self.observing and self.observer.wants_debug()

    def rank_factors(self, target_id: str) -> RankFactors:
        factors = self.factors.get(target_id)
        if factors is None:
            factors = self.factors[target_id] = RankFactors(self.config.stats_window_size)
        return factors
