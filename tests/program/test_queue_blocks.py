"""Rank queues kept in blocks: the order and bounds match a plain sorted list, and a scheduling pass that
skips blocks decides exactly what a pass over every candidate decides.

The comparisons swap functions inside the scheduler, which compiled modules would not see: they run on the
plain-Python modules (``support.pure``), the same source the compiled build is made from."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

import pytest

from progrouter.config import PrefillCostModel
from progrouter.program.core.admission import largest_fitting
from support.program_loop import POOL, Decision, ProgramModules, closed_loop
from support.pure import plain_python


@pytest.fixture
def m() -> Iterator[ProgramModules]:
    with plain_python("progrouter.program") as load:
        yield ProgramModules.load(load)


def _program(m: ProgramModules, serial: int) -> Any:
    ref = m.state.ProgramRef(POOL, f"p{serial}", 0)
    return m.state.Program(ref, serial, ref.redacted_id(), 0.0, None)  # (the queues read ref and serial only)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_blocks_keep_the_order_and_bounds_of_a_sorted_list(
    seed: int, m: ProgramModules, monkeypatch: Any
) -> None:
    monkeypatch.setattr(m.queues, "BLOCK_KEYS", 4)  # many splits and merges at a few hundred keys
    rng = random.Random(seed)
    queue = m.queues.RankQueue()
    live: dict[int, tuple[Any, Any]] = {}
    for step in range(2000):
        if live and (len(live) > 300 or rng.random() < 0.45):
            serial = rng.choice(sorted(live))
            program, _ = live.pop(serial)
            queue.remove(program)
            assert queue.entry(program) is None
        else:
            program = _program(m, step)
            key = (rng.randint(0, 1), 0, 0, rng.random(), 0.0, program.ref.program_id, program.serial)
            forced_at = math.inf if rng.random() < 0.5 else rng.uniform(0.0, 10.0)
            entry = m.records.QueueEntry(key, rng.randint(1, 1000), rng.randint(0, 1000), forced_at)
            queue.insert(program, entry)
            live[program.serial] = (program, entry)
        expected = sorted(live.values(), key=lambda pe: pe[1].key)
        assert [p for p, _ in expected] == queue.ordered() == [queue.program(e[0]) for e in queue.entries()]
        assert len(queue) == len(live)
        assert queue.first() is (expected[0][0] if expected else None)
        assert queue.min_required() == min((e.required for _, e in expected), default=0)
        assert queue.min_uncached() == min((e.uncached for _, e in expected), default=0)
        if expected and step % 7 == 0:
            probe = expected[rng.randrange(len(expected))][1].key
            assert queue.ahead_of(probe) == [e.key for _, e in expected].index(probe)
            # a skipped block never hides an entry the bounds would let through
            bound = rng.randint(1, 1000)

            def above(required: int, _u: int, _f: float, bound: int = bound) -> bool:
                return required > bound

            kept = [queue.program(e[0]) for e in queue.entries(above)]
            assert {p for p, e in expected if e.required <= bound} <= set(kept)


def _run(
    m: ProgramModules, seed: int, monkeypatch: Any, *, skip: bool, screen: bool = True, **fields: Any
) -> tuple[list[Decision], int]:
    """``closed_loop`` with queue blocks of two keys. Returns every decision in order and how many blocks
    the passes skipped (``skip`` False: a pass looks at every block; ``screen`` False: every candidate there
    is planned)."""
    monkeypatch.setattr(m.queues, "BLOCK_KEYS", 2)
    if not screen:  # every candidate planned, each batch-gain bound computed afresh (no memo)
        monkeypatch.setattr(m.resume, "_screened", lambda _view, entries, *_: (e[0] for e in entries))
        covers = m.admission.RankView._batch_bound_covers

        def afresh(view: Any, uncached: int) -> bool:
            view._covered_up_to, view._refused_from = -math.inf, math.inf
            return bool(covers(view, uncached))

        monkeypatch.setattr(m.admission.RankView, "_batch_bound_covers", afresh)
    skipped = 0
    hopeless = m.resume._hopeless

    def counting(view: Any, now: float) -> Any:
        test = hopeless(view, now)

        def wrapped(required: int, uncached: int, forced_at: float) -> bool:
            nonlocal skipped
            result = skip and test(required, uncached, forced_at)
            skipped += result
            return bool(result)

        return wrapped

    monkeypatch.setattr(m.resume, "_hopeless", counting)
    return closed_loop(m, seed, **fields), skipped


@pytest.mark.parametrize("seed", [1, 2])
def test_skipping_blocks_decides_what_a_full_scan_decides(
    seed: int, m: ProgramModules, monkeypatch: Any
) -> None:
    skipping, skipped = _run(m, seed, monkeypatch, skip=True)
    scanning, none = _run(m, seed, monkeypatch, skip=False)
    assert skipped > 100 and none == 0  # blocks were really skipped in one run and never in the other
    assert len(skipping) > 1000
    assert skipping == scanning


#: recovery cheap enough that the batch-gain bound covers some candidates and refuses others
CHEAP_RECOVERY = {
    "prefill_cost_model": PrefillCostModel(linear_seconds_per_1k_tokens=0.02, intercept_seconds=0.0)
}


@pytest.mark.parametrize(("seed", "config"), [(1, {}), (2, CHEAP_RECOVERY)])
def test_screened_passes_decide_what_planning_every_candidate_decides(
    seed: int, config: dict[str, Any], m: ProgramModules, monkeypatch: Any
) -> None:
    """The pass drops candidates from their queued facts (demand above the view's limit, ``judge``'s
    refusals with the view's memo of the batch-gain bound, forced ones the Rank cannot take past its
    limits) and skips blocks: the decisions are those of planning every queued candidate in resume order,
    each bound computed afresh."""
    dropped = 0
    screened = m.resume._screened

    def counting(view: Any, entries: Any, *args: Any) -> Any:
        nonlocal dropped
        seen = list(entries)
        kept = list(screened(view, iter(seen), *args))
        dropped += len(seen) - len(kept)
        return iter(kept)

    monkeypatch.setattr(m.resume, "_screened", counting)
    fast, _ = _run(m, seed, monkeypatch, skip=True, **config)
    assert dropped > 1000  # the screen really refused candidates without planning them
    monkeypatch.undo()
    slow, none = _run(m, seed, monkeypatch, skip=False, screen=False, **config)
    assert none == 0
    assert len(fast) > 1000
    assert fast == slow


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_demand_limit_is_the_largest_demand_the_token_check_admits(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(2000):
        scale = 10.0 ** rng.randint(0, 17)
        used = rng.uniform(0.0, scale)
        low = used + rng.uniform(-scale, scale) * rng.choice([1e-9, 1e-3, 1.0])
        limit = largest_fitting(used, low)
        if math.isinf(limit):
            assert limit > 0 and not abs(low - used) < 2.0**52
            continue
        fits = int(limit)
        assert used + fits <= low and not used + (fits + 1) <= low
