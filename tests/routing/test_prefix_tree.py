import random

import pytest

from progrouter.routing.prefix_tree import CacheAwareIndex


def test_match_reports_prefix_chars_per_target() -> None:
    idx = CacheAwareIndex(10_000)
    idx.insert("hello world", "a")
    idx.insert("hello there", "b")
    assert idx.match("hello world!") == {"a": 11, "b": 6}
    assert idx.match("help") == {"a": 3, "b": 3}
    assert idx.match("xyz") == {}
    assert idx.match("") == {}
    assert idx.size("a") == 11 and idx.size("b") == 11


def test_split_keeps_sizes_and_matches() -> None:
    idx = CacheAwareIndex(10_000)
    idx.insert("abcdef", "a")
    idx.insert("abcxyz", "a")
    assert idx.size("a") == 9  # "abc" + "def" + "xyz"
    assert idx.match("abcdefg") == {"a": 6}
    assert idx.match("abcx") == {"a": 4}


def test_remove_target_forgets_it() -> None:
    idx = CacheAwareIndex(10_000)
    idx.insert("shared prefix one", "a")
    idx.insert("shared prefix two", "b")
    idx.remove_target("a")
    assert idx.match("shared prefix one") == {"b": 14}
    assert idx.size("a") == 0
    idx.remove_target("b")
    assert idx.match("shared prefix") == {}


def test_eviction_pass_trims_to_the_bound_and_drops_least_recent() -> None:
    idx = CacheAwareIndex(100)
    idx.insert("old-" + "o" * 40, "a")
    idx.insert("mid-" + "m" * 40, "a")
    idx.match("old-")  # matching does not refresh
    idx.insert("new-" + "n" * 40, "a")  # 132 chars: over the bound, under the hard cap, kept until a pass
    idx.insert("zzzzz", "b")
    assert idx.size("a") == 132
    assert idx.evict() == 44
    assert idx.size("a") == 88 and idx.size("b") == 5
    assert "a" not in idx.match("old-" + "o" * 40)
    assert idx.match("new-" + "n" * 40) == {"a": 44}
    assert idx.evict() == 0


def test_insert_past_twice_the_bound_trims_at_once() -> None:
    idx = CacheAwareIndex(100)
    for i in range(5):
        idx.insert(f"{i}-" + "x" * 48, "a")  # 50 chars each
    assert idx.size("a") == 100 and "a" not in idx.match("0-" + "x" * 48)


def test_eviction_keeps_memory_bounded_under_random_load() -> None:
    rng = random.Random(3)
    idx = CacheAwareIndex(2_000)
    for _ in range(500):
        text = "".join(rng.choice("abcd") for _ in range(rng.randint(1, 200)))
        idx.insert(text, rng.choice(["a", "b"]))
        assert idx.size("a") <= 4_000 and idx.size("b") <= 4_000
    # the physical tree holds no more than what the targets account for
    stack, total = [idx._root], 0
    while stack:
        node = stack.pop()
        total += len(node.text)
        assert node.targets or node is idx._root
        stack.extend(node.children.values())
    assert total <= idx.size("a") + idx.size("b")


def test_choose_by_load_prefers_affinity_when_balanced() -> None:
    idx = CacheAwareIndex(10_000, cache_threshold=0.5, balance_abs_threshold=4, balance_rel_threshold=1.5)
    idx.insert("system prompt: you are a coder. user: fix bug 1", "a")
    choice = idx.choose_by_load("system prompt: you are a coder. user: fix bug 2", [("a", 2), ("b", 0)])
    assert choice == ("a", "cache_affinity")


def test_choose_by_load_balances_when_imbalanced() -> None:
    idx = CacheAwareIndex(10_000, cache_threshold=0.5, balance_abs_threshold=4, balance_rel_threshold=1.5)
    idx.insert("same text", "a")
    assert idx.choose_by_load("same text", [("a", 10), ("b", 1)]) == ("b", "load_balance")
    # abs exceeded but not rel → still balanced
    assert idx.choose_by_load("same text", [("a", 20), ("b", 15)]) == ("a", "cache_affinity")


def test_choose_by_load_low_match_takes_least_loaded_then_smallest_tree() -> None:
    idx = CacheAwareIndex(10_000, cache_threshold=0.5)
    idx.insert("a long text on a", "a")
    assert idx.choose_by_load("zzz", [("a", 0), ("b", 0)]) == ("b", "low_match_min_load")
    assert idx.choose_by_load("zzz", [("a", 0), ("b", 3)]) == ("a", "low_match_min_load")


def test_choose_by_load_ignores_targets_not_in_candidates() -> None:
    idx = CacheAwareIndex(10_000)
    idx.insert("text cached on gone", "gone")
    assert idx.choose_by_load("text cached on gone", [("b", 0)]) == ("b", "low_match_min_load")
    with pytest.raises(ValueError):
        idx.choose_by_load("x", [])


def test_choose_initial_weights_affinity_by_pressure() -> None:
    idx = CacheAwareIndex(10_000, cache_threshold=0.3)
    text = "task prompt " * 10
    idx.insert(text, "r0")
    assert idx.choose_initial(text, [("r0", 0.3), ("r1", 0.0)]) == "r0"  # 0.7*2 > 1
    assert idx.choose_initial(text, [("r0", 0.6), ("r1", 0.0)]) == "r1"  # 0.4*2 < 1
    assert idx.choose_initial(text, [("r0", 1.0), ("r1", 0.9)]) == "r1"


def test_choose_initial_cold_burst_spreads_by_pressure() -> None:
    idx = CacheAwareIndex(10_000)
    assert idx.choose_initial("new program", [("r0", 0.0), ("r1", 0.0)]) == "r0"
    assert idx.choose_initial("other program", [("r0", 0.2), ("r1", 0.0)]) == "r1"
