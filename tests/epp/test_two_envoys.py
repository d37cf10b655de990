"""Many data planes, one brain: two Envoys share one EPP, so one Program has one ledger whichever Envoy
carries its turns."""

from __future__ import annotations

import itertools
from typing import Any

import aiohttp
import pytest

from integration.helpers import program_body, programs, words
from integration.test_program_scheduling import PREFIX
from support.factories import EngineFactory

from .conftest import StackFactory, program_config
from .test_program_scenarios import diagnostics, post

pytestmark = pytest.mark.timeout(90)


async def test_turns_through_alternate_envoys_keep_one_ledger(
    make_engine: EngineFactory, make_stack: StackFactory, client: aiohttp.ClientSession
) -> None:
    engines = [await make_engine(), await make_engine()]
    stack = await make_stack([e.url for e in engines], program_config(), envoys_count=2)
    assert stack.envoys[0].url != stack.envoys[1].url
    history = words("h", 300)
    replies: list[dict[str, Any]] = []
    for turn in range(6):
        envoy = stack.envoys[turn % 2]
        history += " " + words("t", 40, 300 + 40 * turn)
        status, reply = await post(
            client, envoy.url, program_body("prog-x", history, kv_retention_ttl_seconds=60)
        )
        assert status == 200, reply
        replies.append(reply)

    d = await diagnostics(client, stack)
    [program] = programs(d)  # one Program, not one per Envoy
    assert program["state"] == "active"
    home = program["last_target"]
    # Every turn landed on the same engine, which therefore kept its KV warm across both Envoys.
    [home_engine] = [e for e in engines if e.url == home]
    [other] = [e for e in engines if e.url != home]
    assert home_engine.server.cores[0].stats.prompt_tokens == sum(
        r["usage"]["prompt_tokens"] for r in replies
    )
    assert other.server.cores[0].stats.prompt_tokens == 0
    for before, after in itertools.pairwise(replies):
        assert (
            after["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0.9 * before["usage"]["prompt_tokens"]
        )
    # One ledger: each turn's usage was counted once, and nothing is left in flight.
    feedback = stack.epp.registry.get_sample_value(
        PREFIX + "token_estimate_feedback_total",
        {"model_pool": "program:model:emu", "endpoint": "/v1/chat/completions", "outcome": "observed"},
    )
    assert feedback == 6
    [ranked] = [r for r in d["ranks"] if r["target_id"] == home]
    assert ranked["router_in_flight_requests"] == 0
    assert ranked["router_active_programs"] == 1
    assert all(r["router_active_programs"] == 0 for r in d["ranks"] if r["target_id"] != home)
