"""The transition table refuses what it does not list, and a refused change leaves the Program as it was.

Compiled, an identity check against a tuple sentinel stopped matching and illegal changes were applied
silently; no legal run reaches the refusal, so it is tested here for every pair the table leaves out."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from conftest import POOL, T0, Harness
from progrouter.program.core.state import (
    AR,
    TRANSITIONS,
    Event,
    IllegalTransition,
    ProgramState,
    ProgramStatus,
)

PHASES = list(itertools.product(ProgramState, ProgramStatus))


def test_the_public_moves_refuse_an_active_reasoning_program(harness: Any) -> None:
    h: Harness = harness()
    handle = h.arrive("a", 100)
    assert h.dispatched(handle)
    table = h.scheduler.parts.table
    program = table.get(POOL, "a")
    assert program is not None and program.phase == AR and program.placement == T0
    with pytest.raises(IllegalTransition, match="activate is not allowed from active"):
        table.activate(program, T0, 100)
    with pytest.raises(IllegalTransition, match="pause is not allowed from active"):
        table.pause(program)
    assert program.phase == AR and program.placement == T0


@pytest.mark.parametrize(
    ("event", "phase"),
    [(e, p) for e in Event for p in PHASES if p not in TRANSITIONS[e]],
    ids=lambda v: v.value if isinstance(v, Event) else "+".join(v),
)
def test_every_pair_the_table_leaves_out_is_refused_and_changes_nothing(
    harness: Any, event: Event, phase: tuple[ProgramState, ProgramStatus]
) -> None:
    h: Harness = harness()
    h.arrive("a", 100)
    table = h.scheduler.parts.table
    program = table.get(POOL, "a")
    assert program is not None
    program.state, program.status = phase
    with pytest.raises(IllegalTransition, match=f"{event} is not allowed from"):
        table._move(program, event)
    assert program.phase == phase
