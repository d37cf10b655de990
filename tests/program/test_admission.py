"""One admission rule: the scheduling pass's early refusals never refuse what ``plan`` would admit."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import T0, T1, Harness
from progrouter.program.core.admission import Rejection, plan
from progrouter.program.types import BackendObservation

pytestmark = pytest.mark.timeout(120)

CHECKED: list[int] = []  # candidates compared per example (the property must not hold vacuously)

steps = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "arrive", "arrive", "complete", "complete", "observe", "tick"]),
        st.integers(0, 24),  # which Program
        st.integers(300, 1500),  # context or prompt tokens
        st.sampled_from([None, 0.0, 2.0]),  # acting TTL hint
    ),
    min_size=10,
    max_size=80,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps, batch_gain=st.booleans(), window=st.sampled_from([2, 100]))
def test_quick_refusal_never_refuses_what_plan_would_admit(
    steps: list[tuple[str, int, int, float | None]], batch_gain: bool, window: int
) -> None:
    config: dict[str, Any] = {
        "token_capacity_per_dp_rank": 3000,
        "max_active_programs_per_target": 6,
        "stats_window_size": window,
        "enable_batch_gain_admission": batch_gain,
    }
    h = Harness([T0, T1], **config)
    handles: dict[int, Any] = {}
    checked = 0
    for action, i, tokens, ttl in steps:
        h.at(h.now + 0.3)
        if action == "arrive" and i not in handles:
            handles[i] = h.arrive(f"p{i}", tokens, kv_retention_ttl_seconds=ttl)
        elif action == "complete" and i in handles and h.dispatched(handles[i]):
            h.complete(handles.pop(i), prompt=tokens, cached=tokens // 2)
        elif action == "observe":
            h.observe({T0: BackendObservation(min(1.0, tokens / 1500), 2, 0)})
        elif action == "tick":
            h.tick()
        checked += _check_every_queue(h)
    CHECKED.append(checked)


def _check_every_queue(h: Harness) -> int:
    core = h.scheduler
    checked = 0
    for rank_id in core.parts.fleet.targets:
        queue = core.parts.queues.get(rank_id)
        if queue is None or not len(queue):
            continue
        view = core.parts.views.of(rank_id, h.now)
        bound_refuses = not view.admits_some(queue.min_required(), queue.min_uncached())
        for program in queue.ordered():
            entry, force = queue.entry(program), core.parts.keeper.record(program)
            assert entry is not None
            if force is not None and force.deadline <= h.now:
                continue  # a forced candidate is never refused early
            quick = isinstance(view.judge(entry.required, entry.uncached), Rejection)
            admitted = not isinstance(plan(view, program, entry, h.now), Rejection)
            assert not (admitted and (quick or bound_refuses)), (program.ref, entry)
            checked += 1
    return checked


def test_the_property_compared_real_candidates() -> None:
    CHECKED.clear()
    test_quick_refusal_never_refuses_what_plan_would_admit()
    assert sum(CHECKED) > 100, CHECKED
