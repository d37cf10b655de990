"""The emulator's Messages and Responses APIs beside real vLLM's: same requests, same shapes and statuses.

Token counts differ (the emulator has a word tokenizer, vLLM the tiny model's), so what is compared is what
clients and the router parse: keys, event sequences (runs of one delta event collapsed), stop reasons,
statuses, error shapes, and the usage identities each server must satisfy on its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from progrouter.engine.server import RunningEngine
from support.factories import EngineFactory
from support.sse import collapsed_names, read_named_events

from .conftest import BLOCK_SIZE, MAX_MODEL_LEN, MODEL_NAME, VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
RANK0 = {"X-data-parallel-rank": "0"}  # both turns on one Rank, so the second can hit the first's blocks
SYSTEM = [
    {
        "type": "text",
        "text": " ".join(f"rule{i}" for i in range(120)),
        "cache_control": {"type": "ephemeral"},
    }
]


@pytest.fixture
def engine_defaults() -> dict[str, Any]:
    return {
        "time_scale": 1000.0,
        "model_name": MODEL_NAME,
        "block_size": BLOCK_SIZE,
        "num_blocks": 512,
        "max_model_len": MAX_MODEL_LEN,
    }


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def servers(make_engine: EngineFactory, vllm_server: VllmServer) -> dict[str, str]:
    engine: RunningEngine = await make_engine()
    return {"vllm": vllm_server.url, "emulator": engine.url}


async def post(
    http: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    async with http.post(url, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def stream(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> list[tuple[str, dict[str, Any]]]:
    async with http.post(url, json={**body, "stream": True}, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        return await read_named_events(resp)


def skeleton(obj: Any) -> Any:
    """``obj`` with what legitimately differs between the servers blanked: ids, times, generated text and
    every count (token counts differ with the tokenizer); keys, nesting, strings and nulls stay."""
    if isinstance(obj, dict):
        blank = ("id", "created_at", "text", "delta", "item_id")
        return {k: "·" if k in blank and isinstance(v, str | int) else skeleton(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [skeleton(v) for v in obj]
    if isinstance(obj, int) and not isinstance(obj, bool):
        return "N"
    return obj


def first_of_each(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Each event name's data skeleton, from its first occurrence."""
    keys: dict[str, Any] = {}
    for name, data in events:
        keys.setdefault(name, skeleton(data))
    return keys


def messages_turns() -> tuple[dict[str, Any], dict[str, Any]]:
    """A Claude Code-like first turn and the second turn that re-sends it with a tool call and its result."""
    first: dict[str, Any] = {
        "model": MODEL_NAME,
        "max_tokens": 4,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": "list the files in this repository please"}],
    }
    assistant = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "I will list them."},
            {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
        ],
    }
    result = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "README.md src tests"},
            {"type": "text", "text": "now summarise them"},
        ],
    }
    return first, {**first, "messages": [*first["messages"], assistant, result]}


def prompt_total(usage: dict[str, Any]) -> int:
    return int(
        usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
    )


async def test_messages_answers_match_vllm(servers: dict[str, str], http: aiohttp.ClientSession) -> None:
    first, second = messages_turns()
    shapes = {}
    for name, url in servers.items():
        n1 = (await post(http, url + "/v1/messages/count_tokens", _counted(first)))[1]["input_tokens"]
        status, one = await post(http, url + "/v1/messages", first, RANK0)
        assert status == 200, (name, one)
        status, two = await post(http, url + "/v1/messages", second, RANK0)
        assert status == 200, (name, two)
        status, counted = await post(http, url + "/v1/messages/count_tokens", _counted(second))
        assert status == 200, (name, counted)
        # on each server: count_tokens is the whole prompt, which usage splits three ways
        assert prompt_total(one["usage"]) == n1, name
        assert prompt_total(two["usage"]) == counted["input_tokens"], name
        assert n1 >= 2 * BLOCK_SIZE, name
        # the second turn re-reads (at least) the first prompt's whole blocks but its last
        assert two["usage"]["cache_read_input_tokens"] >= (n1 - 1) // BLOCK_SIZE * BLOCK_SIZE, (name, two)
        shapes[name] = (one["id"].split("-")[0], skeleton(one), skeleton(two), skeleton(counted))
    assert shapes["emulator"] == shapes["vllm"]


def _counted(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("max_tokens", "stream")}


async def test_messages_with_tools_match_vllm(servers: dict[str, str], http: aiohttp.ClientSession) -> None:
    """Claude Code always sends tools; a stock vLLM (no tool parser) takes them with ``tool_choice`` none."""
    first, _ = messages_turns()
    tool = {"name": "bash", "description": "run", "input_schema": {"type": "object"}}
    body = {**first, "tools": [tool], "tool_choice": {"type": "none"}}
    seen = {}
    for name, url in servers.items():
        status, msg = await post(http, url + "/v1/messages", body, RANK0)
        assert status == 200, (name, msg)
        seen[name] = skeleton(msg)
    assert seen["emulator"] == seen["vllm"]


async def test_messages_stream_matches_vllm(servers: dict[str, str], http: aiohttp.ClientSession) -> None:
    first, _ = messages_turns()
    seen = {}
    for name, url in servers.items():
        events = await stream(http, url + "/v1/messages", first, RANK0)
        seen[name] = (collapsed_names(events), first_of_each(events))
    assert seen["emulator"] == seen["vllm"]
    assert seen["vllm"][0] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def responses_body() -> dict[str, Any]:
    """What Codex sends: instructions, function tools, input items with a tool call and its output."""
    return {
        "model": MODEL_NAME,
        "instructions": " ".join(f"rule{i}" for i in range(60)),
        "max_output_tokens": 4,
        "tools": [
            {
                "type": "function",
                "name": "shell",
                "description": "run a command",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            }
        ],
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "list the files"}],
            },
            {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": '{"cmd": "ls"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "README.md src tests"},
        ],
    }


async def test_responses_answers_match_vllm(servers: dict[str, str], http: aiohttp.ClientSession) -> None:
    body = {**responses_body(), "metadata": {"task": "t1"}, "user": "u1", "temperature": 0.5}
    seen = {}
    for name, url in servers.items():
        status, resp = await post(http, url + "/v1/responses", body)
        assert status == 200, (name, resp)
        usage = resp["usage"]
        assert (
            usage["total_tokens"]
            == usage["input_tokens"] + usage["output_tokens"]
            == usage["input_tokens"] + 4
        )
        details = usage["input_tokens_details"]
        # input_tokens is the whole prompt: both cache shares are parts of it
        assert details["cached_tokens"] + details["cache_write_tokens"] <= usage["input_tokens"], name
        events = await stream(http, url + "/v1/responses", body)
        numbers = [data["sequence_number"] for _, data in events]
        assert numbers == list(range(len(events))), name
        final = events[-1][1]["response"]
        prefixes = (resp["id"].split("_")[0], resp["output"][0]["id"].split("_")[0])
        seen[name] = (
            prefixes,
            skeleton(resp),
            collapsed_names(events),
            first_of_each(events),
            skeleton(final),
        )
    assert seen["emulator"] == seen["vllm"]


BAD_MESSAGES: list[Any] = [
    {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}]},  # no max_tokens
    {"model": MODEL_NAME, "max_tokens": 4},  # no messages
    {"model": MODEL_NAME, "max_tokens": "abc", "messages": []},
    {"model": "nope", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]},
    {"model": MODEL_NAME, "max_tokens": MAX_MODEL_LEN + 1, "messages": [{"role": "user", "content": "x"}]},
    {"model": MODEL_NAME, "max_tokens": 4, "messages": []},
    [1, 2],
]
BAD_RESPONSES: list[Any] = [
    {"model": MODEL_NAME},  # no input
    {"model": MODEL_NAME, "input": 5},
    {"model": "nope", "input": "x"},
    {"model": MODEL_NAME, "input": "x", "max_output_tokens": 0},
    {"model": MODEL_NAME, "input": "x", "max_output_tokens": MAX_MODEL_LEN + 1},
    {"model": MODEL_NAME, "input": []},
    {"model": MODEL_NAME, "input": [{"type": "bogus"}]},
]


def _error_shape(status: int, data: dict[str, Any]) -> tuple[int, str, str]:
    if data.get("type") == "error":
        return status, "anthropic", data["error"]["type"]
    return status, "openai", data["error"]["type"]


async def test_bad_requests_get_vllms_statuses_and_shapes(
    servers: dict[str, str], http: aiohttp.ClientSession
) -> None:
    seen: dict[str, list[tuple[int, str, str]]] = {}
    for name, url in servers.items():
        got = []
        for path, bodies in (
            ("/v1/messages", BAD_MESSAGES),
            ("/v1/messages/count_tokens", BAD_MESSAGES[1:2] + BAD_MESSAGES[3:4]),
            ("/v1/responses", BAD_RESPONSES),
        ):
            for body in bodies:
                got.append(_error_shape(*await post(http, url + path, body)))
        async with http.post(
            url + "/v1/messages", data=b"{bad json", headers={"Content-Type": "application/json"}
        ) as resp:
            got.append(_error_shape(resp.status, await resp.json()))
        seen[name] = got
    assert seen["emulator"] == seen["vllm"]
    assert all(status >= 400 for status, _, _ in seen["vllm"])
