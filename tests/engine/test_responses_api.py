"""The OpenAI Responses API of the emulator over loopback HTTP: shapes, SSE events, cache usage, errors."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from support.factories import EngineFactory
from support.sse import collapsed_names, read_named_events

from .http_helpers import metrics, sample, words

pytestmark = pytest.mark.timeout(60)
TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "description": "run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]
STREAM_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def first_turn() -> dict[str, Any]:
    """What Codex sends: instructions, tools, and the conversation as input items."""
    return {
        "instructions": words(100, "ins"),
        "tools": TOOLS,
        "max_output_tokens": 5,
        "input": [user("list the files " + words(20, "u"))],
    }


def second_turn(first: dict[str, Any], output: list[dict[str, Any]]) -> dict[str, Any]:
    call = {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": '{"cmd": "ls"}'}
    result = {"type": "function_call_output", "call_id": "call_1", "output": "a.py b.py"}
    return {**first, "input": [*first["input"], *output, call, result]}


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, dict[str, Any]]:
    async with http.post(url + "/v1/responses", json=body) as resp:
        return resp.status, await resp.json()


def check_usage(usage: dict[str, Any], n_out: int) -> None:
    assert set(usage) == {
        "input_tokens",
        "input_tokens_details",
        "output_tokens",
        "output_tokens_details",
        "total_tokens",
    }
    assert set(usage["input_tokens_details"]) >= {"cached_tokens", "cache_write_tokens"}
    assert usage["output_tokens_details"]["reasoning_tokens"] == 0
    assert usage["output_tokens"] == n_out
    assert usage["total_tokens"] == usage["input_tokens"] + n_out


async def test_response_has_vllms_shape(make_engine: EngineFactory, http: aiohttp.ClientSession) -> None:
    eng = await make_engine()
    status, resp = await post(http, eng.url, first_turn())
    assert status == 200, resp
    assert resp["id"].startswith("resp_") and resp["object"] == "response"
    assert resp["model"] == "progrouter-emulated" and resp["tool_choice"] == "auto"
    # cut by max_output_tokens: vLLM says incomplete (and still ends a stream with response.completed)
    assert resp["status"] == "incomplete" and resp["incomplete_details"] == {"reason": "max_output_tokens"}
    [item] = resp["output"]
    assert item["id"].startswith("msg_") and (item["type"], item["role"], item["status"]) == (
        "message",
        "assistant",
        "completed",
    )
    [part] = item["content"]
    assert part["type"] == "output_text" and part["annotations"] == [] and len(part["text"].split()) == 5
    check_usage(resp["usage"], 5)
    n = resp["usage"]["input_tokens"]
    assert resp["usage"]["input_tokens_details"] == {
        "cached_tokens": 0,
        "cache_write_tokens": n // 16 * 16,
        "input_tokens_per_turn": [],
        "cached_tokens_per_turn": [],
    }
    m = await metrics(http, eng.url)
    assert sample(m, "vllm:prompt_tokens_total", 0) == n


async def test_string_input_renders_as_one_user_message(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine()
    _, as_item = await post(http, eng.url, {"input": [user("hello there")], "max_output_tokens": 1})
    _, as_text = await post(http, eng.url, {"input": "hello there", "max_output_tokens": 1})
    assert as_text["usage"]["input_tokens"] == as_item["usage"]["input_tokens"] == 5
    assert as_text["tool_choice"] == "none"  # no tools: vLLM reports "none"


async def test_second_turn_reads_the_first_turns_blocks_from_the_cache(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine()
    first = first_turn()
    _, one = await post(http, eng.url, first)
    _, two = await post(http, eng.url, second_turn(first, one["output"]))
    n1, n2 = one["usage"]["input_tokens"], two["usage"]["input_tokens"]
    assert n2 > n1 + 10
    # the second prompt starts with the first and its answer: every whole block the first request computed
    # (its prompt and all but the last generated token) is a hit
    hit = (n1 + 5 - 1) // 16 * 16
    assert hit >= one["usage"]["input_tokens_details"]["cache_write_tokens"] > 0
    details = two["usage"]["input_tokens_details"]
    assert details["cached_tokens"] == hit and details["cache_write_tokens"] == n2 // 16 * 16 - hit
    m = await metrics(http, eng.url)
    assert sample(m, "vllm:prompt_tokens_cached_total", 0) == hit


async def test_stream_emits_vllms_numbered_event_sequence(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine()
    async with http.post(eng.url + "/v1/responses", json={**first_turn(), "stream": True}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = await read_named_events(resp)
    assert collapsed_names(events) == STREAM_EVENTS
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert all(data["type"] == name for name, data in events)
    created = events[0][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    deltas = [data["delta"] for name, data in events if name == "response.output_text.delta"]
    assert len(deltas) == 5
    done = next(data for name, data in events if name == "response.output_text.done")
    assert done["text"] == "".join(deltas)
    final = events[-1][1]["response"]
    assert final["id"] == created["id"] and final["status"] == "incomplete"
    assert final["output"][0]["content"][0]["text"] == done["text"]
    check_usage(final["usage"], 5)


async def test_end_of_sequence_completes(make_engine: EngineFactory, http: aiohttp.ClientSession) -> None:
    eng = await make_engine(eos_probability=1.0)
    status, resp = await post(http, eng.url, first_turn())
    assert status == 200 and resp["status"] == "completed" and resp["incomplete_details"] is None


async def test_bad_requests_get_vllms_errors_and_change_nothing(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine()
    before = await metrics(http, eng.url)
    cases: list[tuple[Any, int, str]] = [
        ({"model": "progrouter-emulated"}, 400, "Bad Request"),  # no input
        ({"input": 5}, 400, "Bad Request"),
        ([1], 400, "Bad Request"),
        ({"input": [{"type": "bogus"}]}, 400, "Bad Request"),
        ({"input": "x", "model": "nope"}, 404, "NotFoundError"),
        ({"input": "x", "max_output_tokens": 0}, 400, "BadRequestError"),
        ({"input": "x", "max_output_tokens": 5000}, 400, "BadRequestError"),
        ({"input": []}, 400, "BadRequestError"),
        ({"input": "x", "previous_response_id": "resp_x"}, 404, "invalid_request_error"),
        ({"input": [{"type": "reasoning", "encrypted_content": "e", "summary": []}]}, 400, "BadRequestError"),
    ]
    for body, status, err_type in cases:
        got, data = await post(http, eng.url, body)
        assert got == status, (body, data)
        assert data["error"]["type"] == err_type and data["error"]["code"] == status, (body, data)
    assert (await post(http, eng.url, {"input": 5}))[1]["error"]["param"] == "body.input"
    async with http.post(
        eng.url + "/v1/responses", data=b"{bad", headers={"Content-Type": "application/json"}
    ) as resp:
        assert resp.status == 400 and (await resp.json())["error"]["type"] == "Bad Request"
    assert await metrics(http, eng.url) == before


async def test_the_rank_header_is_ignored_as_vllm_ignores_it(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine(data_parallel_size=2)
    for header in ("1", "x", "7"):
        async with http.post(
            eng.url + "/v1/responses",
            json={"input": "hello there", "max_output_tokens": 1},
            headers={"X-data-parallel-rank": header},
        ) as resp:
            assert resp.status == 200, await resp.text()
    m = await metrics(http, eng.url)
    # idle Ranks tie on load and the first wins: every request went to Rank 0 whatever the header said
    assert [sample(m, "vllm:prompt_tokens_total", r) for r in (0, 1)] == [15, 0]


async def test_max_output_tokens_beyond_what_fits_is_capped(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine(max_model_len=128)
    status, resp = await post(http, eng.url, {"input": words(40), "max_output_tokens": 120})
    assert status == 200, resp
    n = resp["usage"]["input_tokens"]
    assert resp["usage"]["output_tokens"] == resp["max_output_tokens"] == 128 - n
    _, unbounded = await post(http, eng.url, {"input": words(40)})
    assert unbounded["usage"]["output_tokens"] == 128 - n  # no max_output_tokens: all that fits
