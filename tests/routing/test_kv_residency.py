"""The residency index on hand-made event batches (vLLM's layout), with explicit times."""

from __future__ import annotations

from progrouter.routing.kv_residency import Applied, ResidencyIndex, chain_keys

BS = 4
TOKENS = list(range(100, 100 + 3 * BS + 1))


def stored(hashes: list[int], parent: int | None, tokens: list[int]) -> list[object]:
    return ["BlockStored", hashes, parent, tokens, BS, None, "GPU"]


def test_stored_chains_match_a_prompts_keys_and_removal_shortens_the_match() -> None:
    index = ResidencyIndex()
    keys = chain_keys(TOKENS, BS)
    assert len(keys) == 3 and index.match("r0", keys) is None  # never heard: unknown
    assert index.apply("r0", 0, 1.0, [stored([7, 8], None, TOKENS[: 2 * BS])], now=1.5) is Applied.OK
    assert index.apply("r0", 1, 2.0, [stored([9], 8, TOKENS[2 * BS : 3 * BS])], now=2.0) is Applied.OK
    assert index.match("r0", keys) == 3
    assert index.match("r0", chain_keys([1, *TOKENS[1:]], BS)) == 0  # another first block: another chain
    index.apply("r0", 2, 3.0, [["BlockRemoved", [8], "GPU"]], now=3.0)
    assert index.match("r0", keys) == 1
    index.apply("r0", 3, 4.0, [["AllBlocksCleared"]], now=4.0)
    assert index.match("r0", keys) == 0 and index.size() == 0


def test_a_gap_is_refused_until_filled_or_declared_lost() -> None:
    index = ResidencyIndex()
    index.apply("r0", 5, 1.0, [stored([7], None, TOKENS[:BS])], now=1.0)  # the first batch seen starts it
    assert index.apply("r0", 5, 1.0, [], now=1.0) is Applied.STALE
    late = [stored([8], 7, TOKENS[BS : 2 * BS])]
    assert index.apply("r0", 7, 2.0, late, now=2.0) is Applied.GAP
    assert index.match("r0", chain_keys(TOKENS, BS)) == 1  # nothing of the refused batch applied
    index.skip_gap("r0", 7)
    assert index.size() == 0 and index.rank("r0").lost == 1
    assert index.apply("r0", 7, 2.0, late, now=2.0) is Applied.OK
    assert index.match("r0", chain_keys(TOKENS, BS)) == 0  # its parent was forgotten: not matchable


def test_a_silent_rank_becomes_unknown_and_memory_is_bounded() -> None:
    index = ResidencyIndex(silence_seconds=10.0, max_blocks=2)
    index.apply("r0", 0, 0.0, [stored([7, 8, 9], None, TOKENS[: 3 * BS])], now=0.0)
    assert index.size() == 2  # the oldest block went first
    assert index.match("r0", chain_keys(TOKENS, BS)) == 0  # under-reports, never over-reports
    index.expire(now=5.0)
    assert index.match("r0", chain_keys(TOKENS, BS)) == 0
    index.expire(now=10.5)
    assert index.match("r0", chain_keys(TOKENS, BS)) is None and index.size() == 0


def test_a_hash_stored_twice_stays_resident_until_both_copies_are_removed() -> None:
    """vLLM stores a recomputed block again under the same hash and removes each copy on its own."""
    index = ResidencyIndex()
    keys = chain_keys(TOKENS, BS)
    index.apply("r0", 0, 1.0, [stored([7, 8], None, TOKENS[: 2 * BS])], now=1.0)
    index.apply("r0", 1, 1.0, [stored([8], 7, TOKENS[BS : 2 * BS])], now=1.0)  # the second copy
    assert index.match("r0", keys) == 2 and index.size() == 2
    index.apply("r0", 2, 2.0, [["BlockRemoved", [8], "GPU"]], now=2.0)
    assert index.match("r0", keys) == 2  # one copy is left
    index.apply("r0", 3, 3.0, [["BlockRemoved", [8], "GPU"]], now=3.0)
    assert index.match("r0", keys) == 1
