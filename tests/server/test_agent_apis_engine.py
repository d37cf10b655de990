"""Claude Code's and Codex's turns through a router to the engine emulator, which serves the Messages and
Responses APIs as vLLM does: the usage each client sees is the usage the scheduler hears, once per turn, and a
later turn of a session reads the earlier one's prefix from the cache."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from progrouter.engine.server import RunningEngine
from progrouter.server.runner import RunningRouter
from support.factories import EngineFactory, RouterFactory
from support.sse import read_named_events

pytestmark = pytest.mark.timeout(120)

MODEL = "emu"
ENGINE = {"model_name": MODEL, "block_size": 16, "num_blocks": 2048, "time_scale": 50.0}
TOOLS = [{"name": "Bash", "description": "Run a shell command", "input_schema": {"type": "object"}}]
SYSTEM = [
    {"type": "text", "text": "You are Claude Code. " + " ".join(f"rule{i}" for i in range(80))},
    {"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}},
]


async def setup(
    make_engine: EngineFactory, make_router: RouterFactory
) -> tuple[RunningEngine, RunningRouter]:
    engine = await make_engine(**ENGINE)
    return engine, await make_router([engine.url], {"enable_key": "auto"})


async def rank(client: aiohttp.ClientSession, router: RunningRouter) -> dict[str, Any]:
    async with client.get(router.url + "/scheduling/diagnostics") as resp:
        snapshot: dict[str, Any] = await resp.json()
    (only,) = snapshot["ranks"]
    only["token_estimation"] = snapshot["token_estimation"]
    return only


async def test_claude_code_turns_usage_and_cache_through_the_router(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    _engine, router = await setup(make_engine, make_router)
    headers = {"x-claude-code-session-id": "cc-1", "anthropic-version": "2023-06-01", "x-api-key": "k"}
    conversation: list[dict[str, Any]] = [{"role": "user", "content": "list the files " + "x " * 40}]
    prompts, reads = [], []
    for turn in range(2):
        body = {"model": MODEL, "max_tokens": 8, "stream": True, "system": SYSTEM, "tools": TOOLS}
        body["messages"] = conversation
        async with client.post(router.url + "/v1/messages/count_tokens", json=body, headers=headers) as resp:
            assert resp.status == 200
            counted = (await resp.json())["input_tokens"]
        async with client.post(router.url + "/v1/messages?beta=true", json=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            seen = await read_named_events(resp)
        names = [name for name, _ in seen]
        assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
        usage = seen[-2][1]["usage"]
        prompt = (
            usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
        )
        assert prompt == counted  # the token count sized exactly the prompt that was served
        prompts.append(prompt)
        reads.append(usage["cache_read_input_tokens"])
        conversation = [
            *conversation,
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{turn}", "name": "Bash", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"t{turn}", "content": "a.py"}],
            },
        ]
    assert reads[0] == 0 and reads[1] > 0  # the second turn read the first turn's prefix
    state = await rank(client, router)
    rolling = state["rolling"]
    assert rolling["request_samples"] == 2  # two turns, two samples: count_tokens never counted
    assert rolling["avg_prompt_tokens"] == sum(prompts) / 2
    assert rolling["avg_cached_prompt_tokens"] == sum(reads) / 2
    assert len(state["programs"]) == 1
    assert [e["endpoint"] for e in state["token_estimation"]] == ["/v1/messages"]


async def test_codex_turns_usage_and_cache_through_the_router(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    _engine, router = await setup(make_engine, make_router)
    headers = {"session-id": "codex-1"}
    items: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "fix it " + "y " * 60}],
        }
    ]
    prompts, cached = [], []
    for turn in range(2):
        body = {
            "model": MODEL,
            "stream": True,
            "max_output_tokens": 8,
            "instructions": "You are Codex. " + " ".join(f"law{i}" for i in range(80)),
            "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
            "input": items,
        }
        async with client.post(router.url + "/v1/responses", json=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            seen = await read_named_events(resp)
        assert seen[0][0] == "response.created" and seen[-1][0] == "response.completed"
        usage = seen[-1][1]["response"]["usage"]
        prompts.append(usage["input_tokens"])
        cached.append(usage["input_tokens_details"]["cached_tokens"])
        items = [
            *items,
            {"type": "function_call", "name": "shell", "arguments": '{"cmd":"ls"}', "call_id": f"c{turn}"},
            {"type": "function_call_output", "call_id": f"c{turn}", "output": "a.py"},
        ]
    assert cached[0] == 0 and cached[1] > 0
    rolling = (await rank(client, router))["rolling"]
    assert rolling["request_samples"] == 2
    assert rolling["avg_prompt_tokens"] == sum(prompts) / 2
    assert rolling["avg_cached_prompt_tokens"] == sum(cached) / 2
