"""Program scheduling: the sans-I/O core (``ProgramScheduler``) and the value types its shells exchange."""

from progrouter.program.ledger import ObservationEpoch
from progrouter.program.outcomes import Dispatched, Outcome, ProgramDispatch, ProgramRequest, TimedOut
from progrouter.program.pool import RequestHandle
from progrouter.program.records import PauseReason
from progrouter.program.scheduler import ProgramScheduler
from progrouter.program.state import ProgramRef, ProgramState, ProgramStatus

__all__ = [
    "Dispatched",
    "ObservationEpoch",
    "Outcome",
    "PauseReason",
    "ProgramDispatch",
    "ProgramRef",
    "ProgramRequest",
    "ProgramScheduler",
    "ProgramState",
    "ProgramStatus",
    "RequestHandle",
    "TimedOut",
]
