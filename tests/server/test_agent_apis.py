"""The agent-facing routes through a real router over loopback: Anthropic Messages (and its token count) and
OpenAI Responses, streamed and whole — what reaches the worker, what the scheduler hears, what a client gets
when its request is bad."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from progrouter.program.core.diagnostics import redact
from progrouter.server.runner import RunningRouter
from support.agent_streams import anthropic_message, anthropic_stream, responses_object, responses_stream
from support.factories import RouterFactory

from .conftest import WorkerFactory
from .workers import FakeWorker

pytestmark = pytest.mark.timeout(60)

AUTO: dict[str, Any] = {"enable_key": "auto"}
CLAUDE = {
    "x-claude-code-session-id": "sess-1",
    "anthropic-version": "2023-06-01",
    "x-api-key": "client-key",
}
MESSAGES: dict[str, Any] = {
    "model": "m",
    "max_tokens": 64,
    "stream": True,
    "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
}
RESPONSES: dict[str, Any] = {"model": "m", "stream": True, "instructions": "be brief", "input": "hi"}


async def diagnostics(client: aiohttp.ClientSession, router: RunningRouter) -> dict[str, Any]:
    async with client.get(router.url + "/scheduling/diagnostics") as resp:
        assert resp.status == 200
        result: dict[str, Any] = await resp.json()
        return result


async def one_rank(client: aiohttp.ClientSession, router: RunningRouter) -> dict[str, Any]:
    ranks = (await diagnostics(client, router))["ranks"]
    assert len(ranks) == 1
    rank: dict[str, Any] = ranks[0]
    return rank


async def settled(client: aiohttp.ClientSession, router: RunningRouter) -> dict[str, Any]:
    """The Rank once no request is in flight (a ticket finishes as its answer ends)."""
    while (rank := await one_rank(client, router))["router_in_flight_requests"]:
        await asyncio.sleep(0.01)
    return rank


async def post(
    client: aiohttp.ClientSession, router: RunningRouter, path: str, body: Any, headers: dict[str, str]
) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with client.post(router.url + path, data=data, headers=headers) as resp:
        return resp.status, await resp.read()


@pytest.fixture
async def worker(make_worker: WorkerFactory) -> FakeWorker:
    return await make_worker()


# ------------------------------------------------------------------------------------------------ usage
async def test_a_messages_stream_is_relayed_whole_and_its_usage_counted_once(
    worker: FakeWorker, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    router = await make_router([worker.url], AUTO)
    worker.mode, worker.canned = (
        "canned",
        anthropic_stream(10, cache_read=30, cache_creation=20, output_tokens=9),
    )
    status, body = await post(client, router, "/v1/messages?beta=true", MESSAGES, CLAUDE)
    assert status == 200 and body == b"".join(worker.canned)
    assert worker.requests[0]["path"] == "/v1/messages?beta=true"  # the query goes on as sent
    assert router.front_door is not None and router.front_door.served == 1  # and stays on the fast path
    rolling = (await settled(client, router))["rolling"]
    assert rolling["request_samples"] == 1
    assert (rolling["avg_prompt_tokens"], rolling["avg_cached_prompt_tokens"]) == (60, 30)
    assert rolling["avg_completion_tokens"] == 9


async def test_a_responses_stream_is_counted_from_response_completed(
    worker: FakeWorker, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    router = await make_router([worker.url], AUTO)
    worker.mode, worker.canned = "canned", responses_stream(1200, cached=1024, output_tokens=17)
    status, body = await post(client, router, "/v1/responses", RESPONSES, {"session-id": "codex-1"})
    assert status == 200 and body == b"".join(worker.canned)
    rank = await settled(client, router)
    assert rank["programs"][0]["agent_role"] == "lead"
    rolling = rank["rolling"]
    assert rolling["request_samples"] == 1
    assert (rolling["avg_prompt_tokens"], rolling["avg_cached_prompt_tokens"]) == (1200, 1024)


@pytest.mark.parametrize(
    ("path", "answer", "headers", "prompt", "cached"),
    [
        ("/v1/messages", anthropic_message(10, cache_read=30), CLAUDE, 40, 30),
        ("/v1/responses", responses_object(300, cached=256), {"session-id": "codex-1"}, 300, 256),
    ],
    ids=["messages", "responses"],
)
async def test_whole_answers_are_counted_once(
    worker: FakeWorker,
    make_router: RouterFactory,
    client: aiohttp.ClientSession,
    path: str,
    answer: dict[str, Any],
    headers: dict[str, str],
    prompt: int,
    cached: int,
) -> None:
    router = await make_router([worker.url], AUTO)
    worker.mode, worker.canned_json = "canned_json", answer
    body = {**(MESSAGES if path == "/v1/messages" else RESPONSES), "stream": False}
    status, data = await post(client, router, path, body, headers)
    assert status == 200 and orjson.loads(data) == answer
    rolling = (await settled(client, router))["rolling"]
    assert rolling["request_samples"] == 1
    assert (rolling["avg_prompt_tokens"], rolling["avg_cached_prompt_tokens"]) == (prompt, cached)


async def test_a_cut_messages_stream_keeps_the_prompt_it_reported_and_counts_no_completion(
    worker: FakeWorker, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    router = await make_router([worker.url], AUTO)
    worker.mode, worker.canned = "canned_cut", anthropic_stream(5000, cache_read=4000)[:2]
    with pytest.raises(aiohttp.ClientPayloadError):
        await post(client, router, "/v1/messages", MESSAGES, CLAUDE)
    rank = await settled(client, router)
    assert rank["rolling"]["request_samples"] == 0  # a failed answer is no sample
    assert rank["programs"][0]["estimated_context_tokens"] == 9000  # message_start's prompt, once
    assert len(worker.requests) == 1  # bytes were relayed: never retried


# ------------------------------------------------------------------------------------------ count_tokens
async def test_count_tokens_is_proxied_but_never_scheduled(
    worker: FakeWorker, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    router = await make_router([worker.url], AUTO)
    body = {"model": "m", "messages": MESSAGES["messages"]}
    bad_session = {**CLAUDE, "x-claude-code-session-id": "s" * 300}  # an identity that would be refused
    for headers in (CLAUDE, bad_session):
        status, _ = await post(client, router, "/v1/messages/count_tokens", body, headers)
        assert status == 200
    assert [r["path"] for r in worker.requests] == ["/v1/messages/count_tokens"] * 2
    snapshot = await diagnostics(client, router)
    assert snapshot["programs"] == 0 and snapshot["retained_requests"] == 0
    # the same headers on the Messages route do name a Program
    worker.mode, worker.canned_json = "canned_json", anthropic_message(5)
    assert (await post(client, router, "/v1/messages", {**MESSAGES, "stream": False}, CLAUDE))[0] == 200
    assert (await diagnostics(client, router))["programs"] == 1


# ----------------------------------------------------------------------------------------------- headers
@pytest.mark.parametrize("client_keys", [False, True], ids=["open", "client-keys"])
async def test_the_clients_anthropic_headers_reach_the_worker_and_the_router_key_never_does(
    worker: FakeWorker, make_router: RouterFactory, client: aiohttp.ClientSession, client_keys: bool
) -> None:
    keys: dict[str, Any] = {"client_api_keys": ["router-client-key"]} if client_keys else {}
    router = await make_router([worker.url], AUTO, api_key="router-worker-key", **keys)
    headers = {**CLAUDE, "anthropic-beta": "prompt-caching-2024-07-31,interleaved-thinking-2025-05-14"}
    if client_keys:
        headers["Authorization"] = "Bearer router-client-key"
    worker.mode, worker.canned_json = "canned_json", anthropic_message(5)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        assert (await post(client, router, path, {**MESSAGES, "stream": False}, headers))[0] == 200
    for seen in worker.requests:
        got = {k.lower(): v for k, v in seen["headers"].items()}
        assert got["x-api-key"] == "client-key"
        assert got["anthropic-version"] == "2023-06-01"
        assert got["anthropic-beta"] == headers["anthropic-beta"]
        assert got["x-claude-code-session-id"] == "sess-1"
        # the router's worker key goes only where the router authenticated the caller itself
        assert got.get("authorization") == ("Bearer router-worker-key" if client_keys else None)


# ------------------------------------------------------------------------------------------------ errors
def anthropic_error(data: bytes) -> str:
    """The message of an Anthropic error body (asserting its shape)."""
    error = orjson.loads(data)
    assert error["type"] == "error" and set(error) == {"type", "error"}
    assert error["error"]["type"] == "invalid_request_error" or error["error"]["type"] == "request_too_large"
    message: str = error["error"]["message"]
    return message


@pytest.mark.parametrize("front_door", [True, False], ids=["front-door", "aiohttp"])
async def test_bad_input_on_the_messages_routes_gets_anthropics_error_shape_and_changes_nothing(
    worker: FakeWorker, make_router: RouterFactory, client: aiohttp.ClientSession, front_door: bool
) -> None:
    router = await make_router([worker.url], AUTO, max_payload_size=4096, front_door=front_door)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        status, data = await post(client, router, path, b"{not json", CLAUDE)
        assert status == 400 and "malformed JSON" in anthropic_error(data)
        status, data = await post(client, router, path, b"[1, 2]", CLAUDE)
        assert status == 400 and "JSON object" in anthropic_error(data)
        status, data = await post(client, router, path, {**MESSAGES, "pad": "x" * 8192}, CLAUDE)
        assert status == 413 and orjson.loads(data)["error"]["type"] == "request_too_large"
        anthropic_error(data)
    bad_identity = {**CLAUDE, "x-claude-code-session-id": "s" * 300}
    status, data = await post(client, router, "/v1/messages", MESSAGES, bad_identity)
    assert status == 400 and anthropic_error(data).startswith("invalid Program identity")
    # Responses speaks OpenAI's shape
    status, data = await post(client, router, "/v1/responses", b"{not json", {"session-id": "c"})
    assert status == 400 and orjson.loads(data)["error"]["type"] == "invalid_request_error"
    assert worker.requests == []
    assert (await diagnostics(client, router))["programs"] == 0


# -------------------------------------------------------------------------------------- identity lineage
async def test_claude_subagents_are_child_programs_of_their_parent(
    worker: FakeWorker, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    router = await make_router([worker.url], AUTO)
    worker.mode, worker.canned_json = "canned_json", anthropic_message(5)
    body = {**MESSAGES, "stream": False}
    await post(client, router, "/v1/messages", body, CLAUDE)
    child = {**CLAUDE, "x-claude-code-agent-id": "agent-1", "x-claude-code-parent-agent-id": "lead"}
    grandchild = {**CLAUDE, "x-claude-code-agent-id": "agent-2", "x-claude-code-parent-agent-id": "agent-1"}
    for headers in (child, grandchild):
        assert (await post(client, router, "/v1/messages", body, headers))[0] == 200
    programs = {p["agent_id"]: p for p in (await one_rank(client, router))["programs"]}
    lead = programs[None]  # the main agent sends no agent id
    child_program, grandchild_program = (programs[redact(a)] for a in ("agent-1", "agent-2"))
    assert lead["parent_program_id"] is None and lead["agent_role"] == "lead"
    assert child_program["parent_program_id"] == redact("sess-1:lead") and child_program["blocks_parent"]
    assert grandchild_program["parent_program_id"] == redact("sess-1:agent-1")
    root = redact("sess-1:lead")  # a multi-level tree: every Program's root is the lead
    assert {p["root_program_id"] for p in programs.values()} == {root}
    assert {p["agent_role"] for p in (child_program, grandchild_program)} == {"subagent"}


async def test_claude_metadata_user_id_names_a_program_only_with_identity_extensions(
    worker: FakeWorker, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    user_id = orjson.dumps({"device_id": "d", "account_uuid": "a", "session_id": "meta-1"}).decode()
    body = {**MESSAGES, "stream": False, "metadata": {"user_id": user_id}}
    headers = {"anthropic-version": "2023-06-01"}
    worker.mode, worker.canned_json = "canned_json", anthropic_message(5)
    spec = await make_router([worker.url], AUTO)
    assert (await post(client, spec, "/v1/messages", body, headers))[0] == 200
    assert (await diagnostics(client, spec))["programs"] == 0  # the spec's auto: native
    extended = await make_router([worker.url], {**AUTO, "identity_extensions": True})
    assert (await post(client, extended, "/v1/messages", body, headers))[0] == 200
    assert (await diagnostics(client, extended))["programs"] == 1
