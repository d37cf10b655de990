"""bench/retention_bound.py: the knapsack bound at its extremes (KV for everyone: the oracle; no KV: every
return recomputes), and, on a seeded sample, the best TTL rule (gaps unknown) needs more latency than the
knapsack that knows every gap (it can copy the TTL rule's hits for no more KV than they cost)."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from progrouter.engine.profiles import load_profile

from .bench_modules import bench_module

MODEL = load_profile("h200-llama-8b").prefill_cost_model


@pytest.fixture(scope="module")
def rb() -> ModuleType:
    return bench_module("retention_bound")


def turns(rb: ModuleType) -> object:
    rng = np.random.default_rng(0)
    n = 400
    reused = rng.integers(10_000, 120_000, n).astype(float)
    reused[::10] = 0.0  # first turns
    gap = np.where(reused > 0, rng.lognormal(np.log(13.0), 1.5, n), 0.0)
    return rb.Turns(reused + 2_000.0, reused, gap)


def test_unbounded_kv_is_the_oracle_and_no_kv_recomputes_everything(rb: ModuleType) -> None:
    t = turns(rb)
    rich = rb.Bound(t, 8, 1e15, MODEL)
    assert rich.least_latency(10.0) == pytest.approx(10.0)
    assert rich.hit(10.0) == pytest.approx(float(np.sum(t.reused) / np.sum(t.prompt)))
    poor = rb.Bound(t, 8, 1e-9, MODEL)
    every = float(np.mean([MODEL.prefill_seconds(c) if c else 0.0 for c in t.reused]))
    assert poor.least_latency(10.0) == pytest.approx(10.0 + every, rel=1e-6)
    assert poor.hit(30.0) == pytest.approx(0.0, abs=1e-6)


def test_not_knowing_the_gaps_costs(rb: ModuleType) -> None:
    t = turns(rb)
    for capacity in (300_000.0, 900_000.0, 3_000_000.0):
        knows, ttl = rb.Bound(t, 16, capacity, MODEL), rb.TTLBound(t, 16, capacity, MODEL)
        assert ttl.least_latency(10.0) >= knows.least_latency(10.0) - 1e-6
