"""The block pool creates blocks only when it hands them out, with the eviction order of an eager pool."""

from __future__ import annotations

from progrouter.engine.block_pool import BlockPool


def test_a_huge_pool_costs_nothing_until_used() -> None:
    pool = BlockPool(50_000_000)
    assert pool.num_free_blocks == 50_000_000 and pool.usage() == 0.0
    taken = pool.get_new_blocks(3)
    assert [b.block_id for b in taken] == [0, 1, 2]
    assert pool.num_free_blocks == 50_000_000 - 3
    assert len(pool._blocks) == 3  # only what was handed out exists


def test_eviction_order_is_fresh_blocks_first_then_least_recently_freed() -> None:
    pool = BlockPool(6)
    a = pool.get_new_blocks(4)  # 0..3
    pool.cache_full_blocks(a, [10, 11, 12, 13], 0, 4)
    pool.free_blocks([a[2], a[0]])  # freed: 2 then 0
    assert pool.free_queue_ids() == [4, 5, 2, 0]
    assert pool.free_before({0}, 10) == 3 and pool.free_before({4}, 10) == 4  # never-used blocks keep nothing
    again = pool.get_new_blocks(3)
    assert [b.block_id for b in again] == [4, 5, 2]
    assert pool.get_cached_block(12) is None and pool.get_cached_block(10) is a[0]  # 2 was evicted, 0 lives
    assert pool.num_evictions == 1
    assert [b.ref_cnt for b in pool.blocks] == [0, 1, 1, 1, 1, 1]
