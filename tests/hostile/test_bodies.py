"""Hostile request bodies: each gets a 4xx JSON error with a reason and changes no Program state."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from progrouter.server.runner import RunningRouter
from support.factories import EngineFactory, RouterFactory

from .conftest import PROGRAM, Reply, assert_alive, diagnostics, json_post
from .corpus import CHAT_BODIES


def worker_or_router_error(reply: Reply) -> str:
    """The reason of a 4xx JSON error, in the router's shape or a worker's OpenAI shape (which adds param)."""
    assert 400 <= reply.status < 500, reply
    assert reply.headers.get("content-type", "").startswith("application/json"), reply
    error = orjson.loads(reply.body)["error"]
    assert isinstance(error["message"], str) and error["message"]
    return str(error["message"])


@pytest.mark.parametrize("policy", ["round_robin", "cache_aware"])
@pytest.mark.parametrize("name", sorted(CHAT_BODIES))
async def test_bad_chat_body_is_refused_without_state_change(
    make_engine: EngineFactory,
    make_router: RouterFactory,
    client: aiohttp.ClientSession,
    name: str,
    policy: str,
) -> None:
    engine = await make_engine()
    program = {**PROGRAM, "binding_strategy": policy if policy == "cache_aware" else "consistent_hash"}
    router: RunningRouter = await make_router([engine.url], program, policy=policy, max_payload_size=4 << 20)
    before = await diagnostics(client, router)
    reply = await json_post(
        client,
        router.url + "/v1/chat/completions",
        CHAT_BODIES[name],
        headers={"Content-Type": "application/json"},
    )
    worker_or_router_error(reply)
    assert await diagnostics(client, router) == before
    await assert_alive(client, router)
