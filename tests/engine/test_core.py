"""EngineCore in modelled time: prefix cache, LRU reuse, preemption, chunked prefill, step time."""

from __future__ import annotations

import pytest

from progrouter.config import DecodeThroughputModel, PrefillCostModel
from progrouter.engine.block_pool import BlockPool
from progrouter.engine.core import EngineCore, RequestRejected
from progrouter.engine.request import EOS_TOKEN_ID, FinishReason, SamplingParams

from .helpers import run_until_idle, small_config, tokens

pytestmark = pytest.mark.timeout(60)


def test_prefix_reuse_counts_whole_shared_blocks_only() -> None:
    core = EngineCore(small_config())
    a = tokens(1, 100)
    core.add_request("a", a, SamplingParams(max_tokens=2), 0.0)
    run_until_idle(core)
    cases = {
        "shares-70": (a[:70] + tokens(2, 30), 64),  # 4 whole blocks; the 5th block differs
        "identical": (list(a), 96),  # 6 full blocks; the partial 7th is never cached
        "aligned-96": (a[:96], 80),  # fully cached prompt: the last block is recomputed (as vLLM)
        "first-differs": ([9, *a[1:]], 0),  # chained hashes: a different first block shares nothing
    }
    for name, (prompt, _) in cases.items():
        core.add_request(name, prompt, SamplingParams(max_tokens=1), 1.0)
        trace = run_until_idle(core)
        assert trace.finished[name].num_cached_tokens == cases[name][1], name
    assert core.stats.prompt_tokens_cached == 64 + 96 + 80
    assert core.stats.prefix_cache_hits == 64 + 96 + 80


def test_generated_tokens_fill_cached_blocks_too() -> None:
    """A follow-up turn that repeats prompt + output hits the blocks the output filled."""
    core = EngineCore(small_config())
    prompt = tokens(3, 40)
    core.add_request("t1", prompt, SamplingParams(max_tokens=25), 0.0)
    out = run_until_idle(core).tokens["t1"]
    core.add_request("t2", prompt + out + tokens(4, 10), SamplingParams(max_tokens=1), 5.0)
    trace = run_until_idle(core)
    # 40 + 24 computed tokens = 4 full blocks (the last sampled token's KV is never computed, as in vLLM)
    assert trace.finished["t2"].num_cached_tokens == 64


def test_block_pool_reuses_uncached_blocks_first_then_the_least_recently_freed() -> None:
    pool = BlockPool(8)
    a = pool.get_new_blocks(3)
    b = pool.get_new_blocks(3)
    pool.cache_full_blocks(a, [11, 12, 13], 0, 3)
    pool.cache_full_blocks(b, [21, 22, 23], 0, 2)  # b's last block is partial: no hash
    assert pool.num_free_blocks == 2
    pool.free_blocks(reversed(a))  # a request frees tail first
    pool.free_blocks(reversed(b))
    # vLLM (>= 0.11) puts a block that caches nothing at the head, then come never-used blocks, then the
    # cached ones least recently freed first
    assert pool.free_queue_ids() == [5, 6, 7, 2, 1, 0, 4, 3]
    pool.touch([a[1]])  # a cache hit pulls a block out of the queue
    assert pool.free_queue_ids() == [5, 6, 7, 2, 0, 4, 3]
    assert [blk.block_id for blk in pool.get_new_blocks(5)] == [5, 6, 7, 2, 0]


def test_lru_eviction_keeps_the_most_recently_freed_prefix() -> None:
    core = EngineCore(small_config(num_blocks=12))  # 192 tokens of KV
    old, new = tokens(5, 64), tokens(6, 64)
    core.add_request("old", old, SamplingParams(max_tokens=1), 0.0)
    run_until_idle(core)
    core.add_request("new", new, SamplingParams(max_tokens=1), 1.0)
    run_until_idle(core)
    # old and new each left 4 cached free blocks; a 96-token stranger takes 6: the 4 never-used ones, then
    # the 2 least recently freed, which are the last two blocks of "old" (a request frees tail first).
    core.add_request("stranger", tokens(7, 96), SamplingParams(max_tokens=1), 2.0)
    run_until_idle(core)
    core.add_request("new-again", list(new), SamplingParams(max_tokens=1), 3.0)
    trace = run_until_idle(core)
    core.add_request("old-again", list(old), SamplingParams(max_tokens=1), 4.0)
    trace = run_until_idle(core, trace)
    assert trace.finished["new-again"].num_cached_tokens == 48
    # new-again reuses 3 blocks and recomputes its last one into a fresh block: the least recently freed
    # block left is old's second. So only old's first block survives for old-again.
    assert trace.finished["old-again"].num_cached_tokens == 16
    assert core.kv.pool.num_evictions == 2 + 1 + 3


def test_refcounts_shared_blocks_and_no_leak() -> None:
    core = EngineCore(small_config())
    shared = tokens(8, 64)
    for i in range(4):
        core.add_request(f"r{i}", shared + tokens(10 + i, 20), SamplingParams(max_tokens=30), 0.0)
    core.step(0.0)
    first = core.kv.pool.get_cached_block(core.get_request("r0").block_hashes[0])  # type: ignore[union-attr]
    assert first is not None and first.ref_cnt == 4  # one physical block, four users
    run_until_idle(core)
    pool = core.kv.pool
    assert pool.num_free_blocks == pool.num_blocks
    assert all(b.ref_cnt == 0 for b in pool.blocks)
    assert core.kv.num_requests == 0
    with pytest.raises(AssertionError):
        pool.free_blocks([pool.blocks[0]])


def test_preemption_under_pressure_recomputes_the_newest() -> None:
    core = EngineCore(small_config(num_blocks=16))  # 256 tokens for 3 requests that each grow to 150
    for i in range(3):
        core.add_request(f"p{i}", tokens(20 + i, 50), SamplingParams(max_tokens=100), 0.0)
    trace = run_until_idle(core)
    assert core.stats.num_preemptions > 0
    assert core.get_request("p2") is None
    assert all(len(trace.tokens[f"p{i}"]) == 100 for i in range(3))
    assert all(trace.finished[f"p{i}"].finish_reason is FinishReason.LENGTH for i in range(3))
    # FCFS: the oldest request is never the victim, so it finishes first
    assert trace.finished_at["p0"] < trace.finished_at["p1"] < trace.finished_at["p2"]
    assert core.kv.pool.num_free_blocks == 16


def test_preempted_request_tracks_its_preemptions() -> None:
    core = EngineCore(small_config(num_blocks=10))
    core.add_request("old", tokens(30, 60), SamplingParams(max_tokens=60), 0.0)
    core.add_request("young", tokens(31, 60), SamplingParams(max_tokens=60), 0.0)
    young = core.get_request("young")
    old = core.get_request("old")
    assert young is not None and old is not None
    seen_preempted = False
    while (t := core.next_event_time()) is not None:
        core.step(t)
        seen_preempted |= young.num_preemptions > 0
    assert seen_preempted and old.num_preemptions == 0


def test_chunked_prefill_respects_the_token_budget_and_telescopes() -> None:
    budget = 256
    core = EngineCore(small_config(num_blocks=256, max_num_batched_tokens=budget, max_model_len=4096))
    core.add_request("long", tokens(40, 1000), SamplingParams(max_tokens=3), 0.0)
    core.add_request("short", tokens(41, 100), SamplingParams(max_tokens=3), 0.0)
    trace = run_until_idle(core)
    assert all(s.num_scheduled_tokens <= budget for s in trace.steps)
    assert trace.steps[0].num_scheduled_tokens == budget
    prefill_steps = [s for s in trace.steps if s.num_prefill_tokens]
    assert sum(s.num_prefill_tokens for s in prefill_steps) == 1100
    # a lone cold prefill split into 4 chunks costs exactly prefill_seconds(n)
    lone = EngineCore(small_config(num_blocks=256, max_num_batched_tokens=budget, max_model_len=4096))
    lone.add_request("x", tokens(42, 1000), SamplingParams(max_tokens=1), 0.0)
    t = run_until_idle(lone)
    assert len(t.steps) == 4
    assert t.first_token_at["x"] == pytest.approx(PrefillCostModel().prefill_seconds(1000), rel=1e-12)


def test_step_time_matches_the_formula() -> None:
    pre = PrefillCostModel(
        intercept_seconds=0.05, linear_seconds_per_1k_tokens=0.1, quadratic_seconds_per_1k_tokens_squared=0.02
    )
    dec = DecodeThroughputModel(
        fixed_step_seconds=0.01, batch_step_seconds_per_request=0.001, context_step_seconds_per_token=1e-6
    )
    core = EngineCore(small_config(num_blocks=256, prefill_cost_model=pre, decode_throughput_model=dec))
    core.add_request("a", tokens(50, 200), SamplingParams(max_tokens=10), 0.0)
    core.add_request("b", tokens(51, 300), SamplingParams(max_tokens=10), 0.0)
    s1 = core.step(0.0)  # both prefill, nobody decodes
    assert s1.duration == pytest.approx(pre.prefill_seconds(200) + pre.prefill_seconds(300))
    s2 = core.step(s1.end)  # both decode: contexts 201 and 301
    assert s2.decode_batch_size == 2
    assert s2.duration == pytest.approx(dec.step_seconds(2, 201 + 301))
    core.add_request("c", tokens(50, 200) + tokens(52, 50), SamplingParams(max_tokens=1), s2.end)
    s3 = core.step(s2.end)  # two decode + c's prefill of 250 - 192 cached = 58 uncached tokens
    assert s3.duration == pytest.approx(dec.step_seconds(2, 202 + 302) + pre.prefill_seconds(58))
    slow = EngineCore(small_config(num_blocks=256, slow_factor=3.0, prefill_cost_model=pre))
    slow.add_request("a", tokens(50, 200), SamplingParams(max_tokens=1), 0.0)
    assert slow.step(0.0).duration == pytest.approx(3 * pre.prefill_seconds(200))


def test_max_num_seqs_and_future_arrivals() -> None:
    core = EngineCore(small_config(num_blocks=256, max_num_seqs=2))
    for i in range(4):
        core.add_request(f"s{i}", tokens(60 + i, 20), SamplingParams(max_tokens=5), 0.0)
    core.add_request("late", tokens(70, 20), SamplingParams(max_tokens=1), 100.0)
    trace = run_until_idle(core)
    assert max(s.num_running for s in trace.steps) == 2
    assert trace.first_token_at["late"] >= 100.0
    assert trace.first_token_at["late"] == pytest.approx(100.0 + PrefillCostModel().prefill_seconds(20))


def test_abort_frees_blocks_and_unknown_ids() -> None:
    core = EngineCore(small_config())
    core.add_request("x", tokens(80, 100), SamplingParams(max_tokens=50), 0.0)
    core.add_request("y", tokens(81, 100), SamplingParams(max_tokens=50), 0.0)
    core.step(0.0)
    assert core.kv_cache_usage() > 0
    assert core.abort("x") and core.abort("y")
    assert not core.abort("x")
    assert core.kv_cache_usage() == 0.0
    assert core.next_event_time() is None
    assert core.stats.request_success["abort"] == 2


def test_rejects_bad_requests() -> None:
    core = EngineCore(small_config(max_model_len=128))
    with pytest.raises(RequestRejected):
        core.add_request("e", [], SamplingParams(max_tokens=1), 0.0)
    with pytest.raises(RequestRejected):
        core.add_request("long", tokens(1, 120), SamplingParams(max_tokens=10), 0.0)
    core.add_request("ok", tokens(1, 10), SamplingParams(max_tokens=1), 0.0)
    with pytest.raises(RequestRejected):
        core.add_request("ok", tokens(1, 10), SamplingParams(max_tokens=1), 0.0)


def test_eos_roll_is_seeded_and_honours_min_tokens() -> None:
    def run(seed: int) -> dict[str, list[int]]:
        core = EngineCore(small_config(num_blocks=256, eos_probability=0.2, seed=seed))
        for i in range(8):
            params = SamplingParams(max_tokens=40, min_tokens=5, ignore_eos=(i == 0))
            core.add_request(f"e{i}", tokens(90 + i, 10), params, 0.0)
        return run_until_idle(core).tokens

    a, b = run(7), run(7)
    assert a == b
    assert len(a["e0"]) == 40 and EOS_TOKEN_ID not in a["e0"]
    assert all(len(t) >= 6 for t in a.values())
    stopped = [t for t in a.values() if t[-1] == EOS_TOKEN_ID]
    assert stopped and all(EOS_TOKEN_ID not in t[:-1] for t in stopped)
    assert run(8) != a


def test_deterministic_for_a_seed_and_input_sequence() -> None:
    def run() -> list[tuple[float, list[tuple[str, tuple[int, ...]]]]]:
        core = EngineCore(small_config(num_blocks=20, seed=3))
        for i in range(6):
            core.add_request(f"d{i}", tokens(100 + i % 2, 40 + i), SamplingParams(max_tokens=30), i * 0.05)
        trace = run_until_idle(core)
        return [(s.end, [(o.request_id, o.new_token_ids) for o in s.outputs]) for s in trace.steps]

    assert run() == run()
