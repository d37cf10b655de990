"""The recompute-cost gate of cross-Rank resume: move a waiter only when its KV on the source is probably
gone or its wait already exceeds what recomputing it costs."""

from __future__ import annotations

from progrouter.program.variants.migration import move_pays


def test_a_fresh_pause_with_a_short_wait_stays() -> None:
    stays = move_pays(waited_seconds=2.0, paused_seconds=5.0, recompute_seconds=20.0, turnover_seconds=60.0)
    assert not stays


def test_a_wait_longer_than_the_recompute_moves() -> None:
    assert move_pays(waited_seconds=20.0, paused_seconds=25.0, recompute_seconds=20.0, turnover_seconds=60.0)


def test_kv_turned_over_on_the_source_moves_at_once() -> None:
    assert move_pays(waited_seconds=1.0, paused_seconds=60.0, recompute_seconds=20.0, turnover_seconds=60.0)


def test_nothing_to_recompute_moves() -> None:
    assert move_pays(waited_seconds=1.0, paused_seconds=1.0, recompute_seconds=0.0, turnover_seconds=60.0)
