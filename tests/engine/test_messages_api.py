"""The Anthropic Messages API of the emulator over loopback HTTP: shapes, SSE events, cache usage, errors."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from support.factories import EngineFactory
from support.sse import collapsed_names, read_named_events

from .http_helpers import metrics, sample, words

pytestmark = pytest.mark.timeout(60)
MODEL = "progrouter-emulated"
TOOLS = [
    {
        "name": "bash",
        "description": "run a shell command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]
SYSTEM = [{"type": "text", "text": words(120, "sys"), "cache_control": {"type": "ephemeral"}}]


def first_turn() -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 6,
        "system": SYSTEM,
        "tools": TOOLS,
        "messages": [{"role": "user", "content": "list the files " + words(20, "u")}],
    }


def second_turn(first: dict[str, Any], answer: str) -> dict[str, Any]:
    """The first turn re-sent with the assistant's answer, a tool call and its result: Claude Code's loop."""
    assistant = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": answer},
            {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
        ],
    }
    result = {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "a.py b.py"}],
            },
            {"type": "text", "text": "now read them"},
        ],
    }
    return {**first, "messages": [*first["messages"], assistant, result]}


async def post(http: aiohttp.ClientSession, url: str, body: Any, **kw: Any) -> tuple[int, dict[str, Any]]:
    async with http.post(url, json=body, **kw) as resp:
        return resp.status, await resp.json()


async def count(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
    fields = {k: v for k, v in body.items() if k not in ("max_tokens", "stream")}
    status, data = await post(http, url + "/v1/messages/count_tokens", fields)
    assert status == 200, data
    assert data["context_management"] == {"original_input_tokens": data["input_tokens"]}
    return int(data["input_tokens"])


def prompt_total(usage: dict[str, Any]) -> int:
    return int(
        usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
    )


async def test_message_has_vllms_shape_and_count_tokens_matches_its_usage(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine()
    body = first_turn()
    n = await count(http, eng.url, body)
    status, msg = await post(http, eng.url + "/v1/messages", body)
    assert status == 200, msg
    assert msg["id"].startswith("chatcmpl-")  # vLLM answers with its chat request's id
    assert (msg["type"], msg["role"], msg["model"]) == ("message", "assistant", MODEL)
    assert msg["stop_reason"] == "max_tokens" and "stop_sequence" not in msg  # null fields are dropped
    assert [b["type"] for b in msg["content"]] == ["text"] and len(msg["content"][0]["text"].split()) == 6
    usage = msg["usage"]
    assert set(usage) == {
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    }
    assert usage["output_tokens"] == 6 and usage["cache_read_input_tokens"] == 0
    assert prompt_total(usage) == n
    # the prompt's whole 16-token blocks were written to the cache; input_tokens is the partial rest
    assert usage["cache_creation_input_tokens"] == n // 16 * 16 and usage["input_tokens"] == n % 16
    m = await metrics(http, eng.url)
    assert sample(m, "vllm:prompt_tokens_total", 0) == n


async def test_second_turn_reads_the_first_turns_blocks_from_the_cache(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine()
    first = first_turn()
    _, one = await post(http, eng.url + "/v1/messages", first)
    second = second_turn(first, one["content"][0]["text"])
    n2 = await count(http, eng.url, second)
    _, two = await post(http, eng.url + "/v1/messages", second)
    n1 = prompt_total(one["usage"])
    # the second prompt starts with the first and its answer: every whole block the first request computed
    # (its prompt and all but the last generated token) is a hit
    hit = (n1 + 6 - 1) // 16 * 16
    assert hit >= one["usage"]["cache_creation_input_tokens"] > 0
    assert two["usage"]["cache_read_input_tokens"] == hit
    assert prompt_total(two["usage"]) == n2
    assert two["usage"]["cache_creation_input_tokens"] == n2 // 16 * 16 - hit
    m = await metrics(http, eng.url)
    assert sample(m, "vllm:prompt_tokens_cached_total", 0) == hit


async def test_tools_and_tool_blocks_count_as_prompt_tokens(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine()
    first = first_turn()
    bare = {k: v for k, v in first.items() if k != "tools"}
    assert await count(http, eng.url, first) > await count(http, eng.url, bare) + 10
    grown = second_turn(first, "ok")
    assert await count(http, eng.url, grown) > await count(http, eng.url, first) + 8
    as_string = {**bare, "system": SYSTEM[0]["text"]}  # a string system renders as the text block does
    assert await count(http, eng.url, as_string) == await count(http, eng.url, bare)


async def test_stream_emits_vllms_event_sequence_with_usage(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine()
    body = {**first_turn(), "stream": True}
    n = await count(http, eng.url, body)
    async with http.post(eng.url + "/v1/messages", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = await read_named_events(resp)
    assert collapsed_names(events) == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["id"].startswith("chatcmpl-") and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"] == {"input_tokens": n, "output_tokens": 0}  # vLLM's first chunk: the whole prompt
    deltas = [d["delta"] for name, d in events if name == "content_block_delta"]
    assert len(deltas) == 6 and all(d["type"] == "text_delta" for d in deltas)
    final = events[-2][1]
    assert final["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert final["usage"]["output_tokens"] == 6 and prompt_total(final["usage"]) == n


async def test_end_of_sequence_is_end_turn(make_engine: EngineFactory, http: aiohttp.ClientSession) -> None:
    eng = await make_engine(eos_probability=1.0)
    status, msg = await post(http, eng.url + "/v1/messages", first_turn())
    assert status == 200 and msg["stop_reason"] == "end_turn"
    assert msg["content"] == [{"type": "text", "text": ""}]


BAD_BODIES: list[tuple[str, Any, int, str]] = [
    (
        "no max_tokens",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
        400,
        "body.max_tokens",
    ),
    ("no messages", {"model": MODEL, "max_tokens": 4}, 400, "body.messages"),
    ("no model", {"max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}, 400, "body.model"),
    ("max_tokens text", {"model": MODEL, "max_tokens": "abc", "messages": []}, 400, "body.max_tokens"),
    (
        "max_tokens 0",
        {"model": MODEL, "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]},
        400,
        "",
    ),
    ("bad role", {"model": MODEL, "max_tokens": 4, "messages": [{"role": "bot", "content": "x"}]}, 400, ""),
    ("not an object", [1, 2], 400, "body"),
]


@pytest.mark.parametrize(("case", "body", "status", "param"), BAD_BODIES, ids=[c[0] for c in BAD_BODIES])
async def test_malformed_body_gets_vllms_validation_error_and_changes_nothing(
    make_engine: EngineFactory, http: aiohttp.ClientSession, case: str, body: Any, status: int, param: str
) -> None:
    eng = await make_engine()
    before = await metrics(http, eng.url)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        if path.endswith("count_tokens") and "max_tokens" in case:
            continue  # count_tokens takes no max_tokens
        got, data = await post(http, eng.url + path, body)
        assert got == status, data
        # vLLM validates the body before its Messages handler runs: the OpenAI shape, type "Bad Request"
        assert data["error"]["type"] == "Bad Request" and data["error"]["code"] == 400, data
        if param:
            assert data["error"]["param"] == param
    assert await metrics(http, eng.url) == before
    assert eng.server.cores[0].kv_cache_usage() == 0


async def test_invalid_json_and_wrong_content_type_are_refused(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine()
    for data, ctype in ((b"{bad json", "application/json"), (b'{"model": "m"}', "text/plain")):
        async with http.post(eng.url + "/v1/messages", data=data, headers={"Content-Type": ctype}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["type"] == "Bad Request"


async def test_errors_after_validation_are_anthropic_shaped(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine()
    before = await metrics(http, eng.url)
    user = [{"role": "user", "content": "x"}]
    cases = [
        ({"model": "nope", "max_tokens": 4, "messages": user}, 404, "NotFoundError"),
        ({"model": MODEL, "max_tokens": 5000, "messages": user}, 400, "BadRequestError"),
        ({"model": MODEL, "max_tokens": 4, "messages": []}, 400, "BadRequestError"),
        ({"model": MODEL, "max_tokens": 4, "stream": True, "messages": []}, 400, "BadRequestError"),
    ]
    for body, status, err_type in cases:
        got, data = await post(http, eng.url + "/v1/messages", body)
        assert got == status, data
        assert data["type"] == "error" and data["error"]["type"] == err_type, data
        assert isinstance(data["error"]["message"], str) and data["error"]["message"]
    got, data = await post(http, eng.url + "/v1/messages/count_tokens", {"model": "nope", "messages": user})
    assert got == 404 and data["type"] == "error"
    assert await metrics(http, eng.url) == before


async def test_max_tokens_beyond_what_fits_is_capped(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine(max_model_len=128)
    body = {"model": MODEL, "max_tokens": 120, "messages": [{"role": "user", "content": words(40)}]}
    n = await count(http, eng.url, body)
    status, msg = await post(http, eng.url + "/v1/messages", body)
    # vLLM 0.32 caps the output at what fits beside the prompt; only more than max_model_len is a 400
    assert status == 200, msg
    assert msg["usage"]["output_tokens"] == 128 - n and msg["stop_reason"] == "max_tokens"


async def test_stream_disconnect_aborts_and_frees_blocks(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine(time_scale=1.0)
    core = eng.server.cores[0]
    body = {**first_turn(), "max_tokens": 3000, "stream": True}
    resp = await http.post(eng.url + "/v1/messages", json=body)
    while not (await resp.content.readline()).startswith(b"event: content_block_delta"):
        pass  # the first token has arrived
    assert core.num_running == 1 and core.kv_cache_usage() > 0
    resp.close()
    for _ in range(500):
        if core.num_running == 0:
            break
        await asyncio.sleep(0.01)
    assert core.num_running == 0 and core.kv_cache_usage() == 0.0
    assert core.stats.request_success["abort"] == 1


async def test_a_refusing_rank_is_an_anthropic_503(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine()
    async with http.post(eng.url + "/admin/fault", json={"rank": None, "mode": "refuse"}) as resp:
        assert resp.status == 200
    status, data = await post(http, eng.url + "/v1/messages", first_turn())
    assert status == 503 and data["type"] == "error" and data["error"]["type"] == "ServiceUnavailable"
    status, data = await post(http, eng.url + "/v1/responses", {"input": "x"})
    assert status == 503 and data["error"]["code"] == 503  # the Responses route keeps the OpenAI shape
