"""The transition table refuses what it does not list, and a refused change leaves the Program as it was
(the table's 'not allowed' answer is a sentinel compared by identity: this holds compiled and plain)."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import T0, Harness
from progrouter.program.state import AA, AR, PR, TRANSITIONS, Event, IllegalTransition


def test_every_phase_an_event_does_not_list_is_refused_and_changes_nothing(harness: Any) -> None:
    h: Harness = harness()
    handle = h.arrive("a", 100)
    assert h.dispatched(handle)
    table = h.scheduler._core.table
    program = table.get("program:model:m", "a")
    assert program is not None and program.phase == AR and program.placement == T0
    with pytest.raises(IllegalTransition, match="activate is not allowed from active"):
        table.activate(program, T0, 100)
    with pytest.raises(IllegalTransition, match="pause is not allowed from active"):
        table.pause(program)
    assert program.phase == AR and program.placement == T0
    h.at(1.0).complete(handle, prompt=100)  # allowed: the Program is idle, the TTL of 0 pauses it
    assert program.phase not in (AR, AA) or program.placement == T0
    refused = {event: set(TRANSITIONS[event]) for event in Event}
    assert PR not in refused[Event.PAUSE] and AR not in refused[Event.ACTIVATE]
