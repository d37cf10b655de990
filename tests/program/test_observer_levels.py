"""An observer that keeps no debug events gets every metric and every other event exactly as one that keeps
them all: the core only skips building what would be dropped."""

from __future__ import annotations

import pytest

from progrouter.config import ProgramSchedulingConfig
from progrouter.program.core.scheduler import ProgramScheduler
from progrouter.program.observer import RecordingObserver
from progrouter.program.outcomes import Dispatched, ProgramRequest
from progrouter.program.types import BackendObservation, ProgramIdentity, RequestHints, UsageObservation
from progrouter.routing.target import Target

pytestmark = pytest.mark.timeout(60)

POOL = "program:model:m"
TARGETS = [Target.parse(f"http://w:1@{r}") for r in range(2)]


class InfoObserver(RecordingObserver):
    """Records like ``RecordingObserver`` but, like a live router logging at info, wants no debug events."""

    def __init__(self) -> None:
        super().__init__()
        self.debug = False

    def wants_debug(self) -> bool:
        return self.debug


def drive(observer: RecordingObserver, *, debug_from_tick: int | None = None) -> None:
    """Programs going through admissions, fitted and hinted TTLs, pauses and continuity samples."""
    config = ProgramSchedulingConfig(
        token_capacity_per_dp_rank=20_000, max_active_programs_per_target=2, stats_window_size=5
    )
    scheduler = ProgramScheduler(config, observer=observer)
    scheduler.set_ranks(POOL, TARGETS, 0.0)
    now, in_flight = 0.0, []
    for step in range(120):
        now += 0.25
        if step % 10 == 0:
            if debug_from_tick is not None and step // 10 == debug_from_tick:
                assert isinstance(observer, InfoObserver)
                observer.debug = True
            epoch = scheduler.begin_observation(now)
            scheduler.apply_observations(now, epoch, {t.id: BackendObservation(0.5, 3, 0) for t in TARGETS})
            scheduler.tick(now)
        i = step % 7
        identity = ProgramIdentity(f"p{i}", f"p{i}", f"header:x-session-id:p{i}")
        hints = RequestHints(kv_retention_ttl_seconds=1.0 if i % 3 == 0 else None)
        scheduler.arrive(now, ProgramRequest(identity, hints, POOL, 1_000 + 200 * step))
        in_flight += [o.dispatch for o in scheduler.take_outcomes() if isinstance(o, Dispatched)]
        if len(in_flight) > 3:
            dispatch = in_flight.pop(0)
            usage = UsageObservation(
                prompt_tokens=1_000 + 200 * step, completion_tokens=50, cached_tokens=900
            )
            scheduler.complete(now, dispatch, success=step % 11 != 0, usage=usage, decode_seconds=0.5)
            in_flight += [o.dispatch for o in scheduler.take_outcomes() if isinstance(o, Dispatched)]


def test_no_debug_events_are_built_and_everything_else_is_reported_the_same() -> None:
    everything, info = RecordingObserver(), InfoObserver()
    drive(everything)
    drive(info)
    assert any(level == "debug" for level, _, _ in everything.events)
    assert not any(level == "debug" for level, _, _ in info.events)
    assert info.events == [e for e in everything.events if e[0] != "debug"]
    assert info.histograms == everything.histograms
    assert info.transitions == everything.transitions
    assert info.gauges == everything.gauges
    assert info.counters == everything.counters


def test_a_change_of_level_is_heard_at_the_next_tick() -> None:
    everything, late = RecordingObserver(), InfoObserver()
    drive(everything)
    drive(late, debug_from_tick=6)  # wants debug events from the tick at step 60 on
    debug = [e for e in everything.events if e[0] == "debug"]
    heard = [e for e in late.events if e[0] == "debug"]
    assert heard and len(heard) < len(debug)
    assert heard == debug[len(debug) - len(heard) :]
    assert late.histograms == everything.histograms
