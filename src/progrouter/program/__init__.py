"""Program scheduling: the sans-I/O core (``ProgramScheduler``) and the public surface its shells use.

Shells import from here: the scheduler, the request and outcome types, the observations they report, the
errors, the observer protocol, and the read-only summaries (``SchedulerView`` and its frozen
``ProgramRow``). The submodules are the scheduler's own parts.
"""

from progrouter.program.core.diagnostics import DEFAULT_PROGRAM_PAGE, SHOWN_STATES, ProgramRow, SchedulerView
from progrouter.program.core.ledger import ObservationEpoch
from progrouter.program.core.records import PauseReason
from progrouter.program.core.request_pool import RequestHandle
from progrouter.program.core.scheduler import ProgramScheduler
from progrouter.program.core.state import ProgramRef, ProgramState, ProgramStatus
from progrouter.program.observer import LogLevel, NullObserver, RecordingObserver, SchedulerObserver
from progrouter.program.outcomes import Dispatched, Outcome, ProgramDispatch, ProgramRequest, TimedOut
from progrouter.program.residency import Report as ResidencyReport
from progrouter.program.types import (
    BackendObservation,
    InvalidIdentity,
    NoTargets,
    PoolFull,
    ProgramIdentity,
    QueueTimeout,
    RequestHints,
    ScheduleError,
    UsageObservation,
)

__all__ = [
    "DEFAULT_PROGRAM_PAGE",
    "SHOWN_STATES",
    "BackendObservation",
    "Dispatched",
    "InvalidIdentity",
    "LogLevel",
    "NoTargets",
    "NullObserver",
    "ObservationEpoch",
    "Outcome",
    "PauseReason",
    "PoolFull",
    "ProgramDispatch",
    "ProgramIdentity",
    "ProgramRef",
    "ProgramRequest",
    "ProgramRow",
    "ProgramScheduler",
    "ProgramState",
    "ProgramStatus",
    "QueueTimeout",
    "RecordingObserver",
    "RequestHandle",
    "RequestHints",
    "ResidencyReport",
    "ScheduleError",
    "SchedulerObserver",
    "SchedulerView",
    "TimedOut",
    "UsageObservation",
]
