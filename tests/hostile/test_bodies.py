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


# Routes the router validates itself, and routes the emulator serves (worker answers are relayed as is).
ROUTES = ("/v1/completions", "/v1/responses", "/v1/messages", "/generate", "/tokenize", "/detokenize")
UNPARSABLE = {
    k: CHAT_BODIES[k] for k in ("malformed JSON", "JSON array", "invalid UTF-8", "NUL byte in the JSON")
}


@pytest.mark.parametrize("route", ROUTES)
async def test_unparsable_bodies_on_every_route(
    program_router: RunningRouter, client: aiohttp.ClientSession, route: str
) -> None:
    before = await diagnostics(client, program_router)
    for name, body in UNPARSABLE.items():
        reply = await json_post(
            client, program_router.url + route, body, headers={"Content-Type": "application/json"}
        )
        assert 400 <= reply.status < 500, (name, reply)
        worker_or_router_error(reply)
    assert await diagnostics(client, program_router) == before
    await assert_alive(client, program_router)
