"""Killing an engine fails its Programs over to a healthy Rank, over loopback, with no capacity leaked."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from support.factories import EngineFactory, RouterFactory

from .helpers import CAPACITY, program_body, wait_until, words
from .test_program_scheduling import PREFIX, diagnostics, post

pytestmark = pytest.mark.timeout(60)


def programs(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for r in d["ranks"] for p in r["programs"]]


async def test_killing_an_engine_fails_its_programs_over(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engines = [await make_engine(), await make_engine()]
    router = await make_router(
        [e.url for e in engines],
        {"token_capacity_per_dp_rank": CAPACITY, "metrics_interval_seconds": 0.1},
        health_check_interval_secs=0.1,
        health_check_timeout_secs=1.0,
        health_failure_threshold=1,
    )
    # A long retention hint keeps the Program Active on its Rank after the first turn.
    body = program_body("prog-f", words("f", 300), kv_retention_ttl_seconds=600)
    status, first = await post(client, router, body)
    assert status == 200, first
    d = await diagnostics(client, router)
    [program] = programs(d)
    home = program["last_target"]
    assert program["state"] == "active"
    dead = next(e for e in engines if e.url == home)
    survivor = next(e for e in engines if e.url != home)

    await dead.stop()
    d = await wait_until(
        lambda: diagnostics(client, router),
        lambda d: [r["target_id"] for r in d["ranks"]] == [survivor.url],
    )
    [program] = programs(d)
    assert program["last_target"] == survivor.url
    assert program["state"] == "paused"  # its placement died with the engine: it must be admitted again
    assert d["ranks"][0]["router_estimated_used_tokens"] == 0  # nothing charged for the dead placement
    failovers = router.registry.get_sample_value(
        PREFIX + "transitions_total", {"target": home, "reason": "health_failover"}
    )
    assert failovers == 1

    served_before = survivor.server.cores[0].stats.prompt_tokens
    second = program_body("prog-f", words("f", 300) + " " + words("g", 50))
    status, reply = await post(client, router, second)
    assert status == 200, reply
    assert survivor.server.cores[0].stats.prompt_tokens - served_before == reply["usage"]["prompt_tokens"]
    d = await diagnostics(client, router)
    [program] = programs(d)
    assert program["generation"] == 0 and program["last_target"] == survivor.url
    assert len(program["program"]) == 16 and program["program"] != "prog-f"  # the id shown is redacted
