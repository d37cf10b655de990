"""Property: under any interleaving of add / abort / step, block accounting stays exact and nothing leaks."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from progrouter.engine.core import EngineCore
from progrouter.engine.request import SamplingParams

from .helpers import run_until_idle, small_config

pytestmark = pytest.mark.timeout(120)

op = st.one_of(
    st.tuples(
        st.just("add"),
        st.integers(0, 3),  # which shared prefix family
        st.integers(1, 90),  # prompt length
        st.integers(1, 40),  # max_tokens
    ),
    st.tuples(st.just("abort"), st.integers(0, 30), st.just(0), st.just(0)),
    st.tuples(st.just("step"), st.integers(1, 4), st.just(0), st.just(0)),
)


def check_invariants(core: EngineCore) -> None:
    pool = core.kv.pool
    holders: Counter[int] = Counter()
    for blocks in core.kv._req_blocks.values():
        holders.update(b.block_id for b in blocks)
    for block in pool.blocks:
        assert block.ref_cnt >= 0
        assert block.ref_cnt == holders[block.block_id]
    assert set(pool.free_queue_ids()) == {b.block_id for b in pool.blocks if b.ref_cnt == 0}
    for h in list(pool._cached):
        assert pool._cached[h].block_hash == h
    for request in core._requests.values():  # the cached part of a chain is a prefix (lookups bisect)
        cached = [h in pool._cached for h in request.block_hashes]
        assert cached == sorted(cached, reverse=True)
        hits, _ = core.kv.get_computed_blocks(request)
        max_blocks = (request.num_tokens - 1) // core.config.block_size
        assert hits == [pool._cached[h] for h in request.block_hashes[: min(max_blocks, cached.count(True))]]
    sched = core.scheduler
    assert len(sched.running) <= core.config.max_num_seqs
    for request in sched.running:
        assert request.num_computed_tokens <= request.num_tokens


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=60), num_blocks=st.integers(8, 40), budget=st.integers(16, 128))
def test_random_add_abort_step_keeps_blocks_exact(
    ops: list[tuple[str, int, int, int]], num_blocks: int, budget: int
) -> None:
    core = EngineCore(small_config(num_blocks=num_blocks, max_num_batched_tokens=budget, max_num_seqs=6))
    now = 0.0
    added = 0
    for kind, a, b, c in ops:
        if kind == "add":
            prompt = [500 + a] * 16 + [1000 + added * 97 + i for i in range(b)]
            max_len = core.config.max_model_len
            prompt = prompt[: max_len - 1]
            params = SamplingParams(max_tokens=min(c, max_len - len(prompt)))
            core.add_request(f"r{added}", prompt, params, now)
            added += 1
        elif kind == "abort":
            core.abort(f"r{a}")
        else:
            for _ in range(a):
                t = core.next_event_time()
                if t is None:
                    break
                result = core.step(t)
                assert result.num_scheduled_tokens <= budget
                now = result.end
        check_invariants(core)
    run_until_idle(core)
    check_invariants(core)
    assert core.kv.num_requests == 0
    assert core.kv.pool.num_free_blocks == num_blocks


def replay(ops: list[tuple[str, int, int, int]], num_blocks: int, budget: int, memo: bool) -> list[object]:
    core = EngineCore(small_config(num_blocks=num_blocks, max_num_batched_tokens=budget, max_num_seqs=6))
    core.scheduler.admission_memo = memo
    now, added = 0.0, 0
    log: list[object] = []
    for kind, a, b, c in ops:
        if kind == "add":
            max_len = core.config.max_model_len
            prompt = ([500 + a] * 48 + [1000 + added * 97 + i for i in range(b)])[: max_len - 1]
            core.add_request(
                f"r{added}", prompt, SamplingParams(max_tokens=min(c, max_len - len(prompt))), now
            )
            added += 1
        elif kind == "abort":
            core.abort(f"r{a}")
        else:
            for _ in range(a):
                t = core.next_event_time()
                if t is None:
                    break
                result = core.step(t)
                now = result.end
                log.append((result.end, [(o.request_id, o.num_cached_tokens) for o in result.outputs]))
    log.append(run_until_idle(core).finished_at)
    return log


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=60), num_blocks=st.integers(8, 24), budget=st.integers(16, 128))
def test_admission_memo_changes_nothing(
    ops: list[tuple[str, int, int, int]], num_blocks: int, budget: int
) -> None:
    """Skipping the blocked head's cache lookup is an optimisation only: same steps, same hits, same times."""
    assert replay(ops, num_blocks, budget, memo=True) == replay(ops, num_blocks, budget, memo=False)
