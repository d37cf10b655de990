import random
import subprocess
import sys
from collections import Counter

import pytest

from progrouter.routing.hash_ring import HashRing, stable_hash64


def test_stable_hash_is_the_same_in_another_process() -> None:
    code = "from progrouter.routing.hash_ring import stable_hash64; print(stable_hash64('session-42'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) == stable_hash64("session-42")
    assert 0 <= stable_hash64("x") < 2**64
    assert stable_hash64("a") != stable_hash64("b")


def test_lookup_is_independent_of_input_order() -> None:
    ids = [f"http://w{i}:8000@{r}" for i in range(4) for r in range(2)]
    shuffled = ids[:]
    random.Random(7).shuffle(shuffled)
    a, b = HashRing(ids, 160), HashRing(shuffled, 160)
    for k in range(500):
        assert a.lookup(f"key-{k}") == b.lookup(f"key-{k}")


def test_keys_spread_over_all_targets() -> None:
    ids = ["t0", "t1", "t2", "t3"]
    counts = Counter(HashRing(ids, 160).lookup(f"k{k}") for k in range(4000))
    assert set(counts) == set(ids)
    assert min(counts.values()) > 600  # 1000 expected each


def test_removing_a_target_moves_only_its_keys() -> None:
    full, reduced = HashRing(["a", "b", "c"], 100), HashRing(["a", "c"], 100)
    for k in range(1000):
        before = full.lookup(f"k{k}")
        if before != "b":
            assert reduced.lookup(f"k{k}") == before


def test_lookup_wraps_past_the_last_point() -> None:
    ring = HashRing(["only"], 1)
    assert ring.lookup("anything") == "only"
    assert len(ring) == 1


def test_rejects_empty_and_zero_vnodes() -> None:
    with pytest.raises(ValueError):
        HashRing([], 10)
    with pytest.raises(ValueError):
        HashRing(["a"], 0)
