"""``"token_capacity_per_dp_rank": "auto"`` once per shell (``serve``, and Envoy + ``epp``): two emulators
with different KV sizes, and admission on each Rank follows the size its ``vllm:cache_config_info``
reports."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from integration.helpers import program_body, wait_until, words
from support.factories import EngineFactory

from .conftest import ShellFactory
from .test_program_scenarios import diagnostics, post

pytestmark = pytest.mark.timeout(90)

SMALL_BLOCKS, LARGE_BLOCKS, BLOCK = 64, 256, 16  # 1024 and 4096 KV tokens


def by_url(d: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["base_url"]: r for r in d["ranks"]}


async def test_each_rank_admits_by_the_kv_size_its_vllm_reports(
    make_engine: EngineFactory, make_shell: ShellFactory, client: aiohttp.ClientSession
) -> None:
    small = await make_engine(num_blocks=SMALL_BLOCKS, max_model_len=SMALL_BLOCKS * BLOCK)
    large = await make_engine(num_blocks=LARGE_BLOCKS, max_model_len=LARGE_BLOCKS * BLOCK)
    config = {
        "token_capacity_per_dp_rank": "auto",
        "metrics_interval_seconds": 0.1,
        "binding_strategy": "program_round_robin",  # homes alternate between the two Ranks
        "admission_waiting_request_threshold": 0,  # the stalled engines queue: this is about token capacity
    }
    shell = await make_shell([small.url, large.url], config)
    status, _ = await post(client, shell.url, program_body("prog-warm", words("w", 20)))  # polling starts
    assert status == 200
    d = await wait_until(
        lambda: diagnostics(client, shell),
        lambda d: all(r["token_capacity_source"] == "reported" for r in d["ranks"]) and len(d["ranks"]) == 2,
    )
    ranks = by_url(d)
    assert ranks[small.url]["token_capacity"] == SMALL_BLOCKS * BLOCK
    assert ranks[large.url]["token_capacity"] == LARGE_BLOCKS * BLOCK
    assert ranks[small.url]["configured_token_capacity"] == "auto"

    small.server.set_fault(None, "stall")
    large.server.set_fault(None, "stall")
    # ~310 estimated tokens + 100 decode buffer each: two fit in 1024, all three in 4096; the count guard
    # (64 Programs) alone would admit all six.
    sent = [
        asyncio.create_task(post(client, shell.url, program_body(f"prog-{i}", words(chr(97 + i), 300))))
        for i in range(6)
    ]
    d = await wait_until(
        lambda: diagnostics(client, shell),
        lambda d: sum(r["router_active_programs"] + r["router_queued_programs"] for r in d["ranks"]) == 6,
    )
    ranks = by_url(d)
    assert (ranks[small.url]["router_active_programs"], ranks[small.url]["router_queued_programs"]) == (2, 1)
    assert (ranks[large.url]["router_active_programs"], ranks[large.url]["router_queued_programs"]) == (3, 0)
    assert 800 < ranks[small.url]["router_estimated_used_tokens"] <= SMALL_BLOCKS * BLOCK

    small.server.set_fault(None, "none")
    large.server.set_fault(None, "none")
    results = await asyncio.wait_for(asyncio.gather(*sent), 30)
    assert [status for status, _ in results] == [200] * 6  # the waiter was served, nothing lost
    d = await wait_until(
        lambda: diagnostics(client, shell),
        lambda d: all(
            r["router_active_programs"] == 0 and r["router_in_flight_requests"] == 0 for r in d["ranks"]
        ),
    )
    assert d["retained_requests"] == 0
    assert all(r["router_ledger_tokens"] == 0 for r in d["ranks"])
