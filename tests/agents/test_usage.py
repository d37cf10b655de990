"""Usage from JSON bodies and SSE streams: OpenAI and Anthropic shapes, chunk splits, caps, monotone merge."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from progrouter.agents.usage import (
    MAX_PARTIAL_SSE_LINE_BYTES,
    SseUsageAccumulator,
    parse_json_usage,
    usage_from_object,
)
from progrouter.program.types import UsageObservation

pytestmark = pytest.mark.timeout(60)


def obs(prompt: int | None, completion: int | None, cached: int | None) -> UsageObservation:
    return UsageObservation(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)


def test_anthropic_usage_is_not_double_counted() -> None:
    body = (
        b'{"usage":{"input_tokens":10,"cache_read_input_tokens":30,'
        b'"cache_creation_input_tokens":20,"output_tokens":5}}'
    )
    assert parse_json_usage(body) == obs(60, 5, 30)


def test_openai_usage_with_cached_details() -> None:
    body = {
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 64},
        }
    }
    assert parse_json_usage(json.dumps(body).encode()) == obs(100, 7, 64)


@pytest.mark.parametrize(
    ("usage", "cached"),
    [
        ({"input_tokens": 50, "input_tokens_details": {"cached_tokens": 40}}, 40),
        ({"prompt_tokens": 50, "cached_input_tokens": 12}, 12),
        ({"prompt_tokens": 50, "cached_tokens": 11}, 11),
        ({"prompt_tokens": 50, "prompt_tokens_details": None}, None),
        (
            {
                "prompt_tokens": 50,
                "prompt_tokens_details": {"cached_tokens": 3},
                "cache_read_input_tokens": 9,
            },
            3,
        ),
    ],
)
def test_cached_token_sources_in_order(usage: dict[str, Any], cached: int | None) -> None:
    assert usage_from_object(usage).cached_tokens == cached


def test_responses_api_input_tokens_include_cached() -> None:
    # OpenAI Responses: input_tokens already includes the cached part, which is only a detail.
    usage = {"input_tokens": 50, "input_tokens_details": {"cached_tokens": 40}, "output_tokens": 3}
    assert usage_from_object(usage) == obs(50, 3, 40)


def test_usage_locations_message_and_response() -> None:
    msg = {"type": "message_start", "message": {"usage": {"input_tokens": 9, "output_tokens": 1}}}
    assert parse_json_usage(json.dumps(msg).encode()) == obs(9, 1, None)
    resp = {"type": "response.completed", "response": {"usage": {"input_tokens": 8, "output_tokens": 2}}}
    assert parse_json_usage(json.dumps(resp).encode()) == obs(8, 2, None)


def test_garbage_and_non_counts_are_ignored() -> None:
    assert parse_json_usage(b"not json").empty
    assert parse_json_usage(b"[1,2]").empty
    assert parse_json_usage(b'{"usage": null}').empty
    assert usage_from_object({"prompt_tokens": -1, "completion_tokens": 2.0, "cached_tokens": True}).empty


def sse(*events: dict[str, Any] | str) -> bytes:
    lines = []
    for event in events:
        data = event if isinstance(event, str) else json.dumps(event)
        lines.append(f"data: {data}\n\n")
    return "".join(lines).encode()


OPENAI_STREAM = sse(
    {"choices": [{"delta": {"role": "assistant"}}]},
    {"choices": [{"delta": {"content": "hi"}}]},
    {
        "choices": [],
        "usage": {
            "prompt_tokens": 120,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 96},
        },
    },
    "[DONE]",
)


def test_sse_usage_split_across_every_possible_chunk_boundary() -> None:
    for cut in range(1, len(OPENAI_STREAM)):
        acc = SseUsageAccumulator()
        acc.feed(OPENAI_STREAM[:cut], 1.0)
        acc.feed(OPENAI_STREAM[cut:], 2.0)
        assert acc.finish() == obs(120, 2, 96), cut


@given(st.lists(st.integers(min_value=0, max_value=len(OPENAI_STREAM)), max_size=20))
def test_sse_usage_survives_any_chunking(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    acc = SseUsageAccumulator()
    prev = 0
    for point in [*points, len(OPENAI_STREAM)]:
        acc.feed(OPENAI_STREAM[prev:point], 0.0)
        prev = point
    assert acc.finish() == obs(120, 2, 96)


def test_sse_anthropic_stream_merges_monotonically() -> None:
    stream = sse(
        {
            "type": "message_start",
            "message": {"usage": {"input_tokens": 10, "cache_read_input_tokens": 30, "output_tokens": 1}},
        },
        {"type": "content_block_delta", "delta": {"text": "x"}},
        {"type": "message_delta", "usage": {"output_tokens": 15}},
    )
    acc = SseUsageAccumulator()
    acc.feed(stream, 0.0)
    assert acc.finish() == obs(40, 15, 30)


def test_sse_crlf_and_unterminated_final_line() -> None:
    acc = SseUsageAccumulator()
    acc.feed(b'data: {"usage":{"prompt_tokens":5}}\r\n\r\n', 0.0)
    acc.feed(b'data: {"usage":{"prompt_tokens":3,"completion_tokens":4}}', 0.0)
    assert acc.usage == obs(5, None, None)
    assert acc.finish() == obs(5, 4, None)


def test_sse_only_data_lines_with_usage_are_parsed() -> None:
    acc = SseUsageAccumulator()
    acc.feed(b'event: x\n: {"usage":{"prompt_tokens":99}}\nid: {"usage":{"prompt_tokens":98}}\n', 0.0)
    acc.feed(b'data: {"choices":[{"delta":{"content":"\\"usage\\" is a word"}}]}\n', 0.0)
    assert acc.finish().empty


def test_sse_oversized_partial_line_is_dropped_and_stream_recovers() -> None:
    acc = SseUsageAccumulator()
    acc.feed(b'data: {"pad":"' + b"x" * (MAX_PARTIAL_SSE_LINE_BYTES + 10), 0.0)
    assert len(acc._buffer) == 0
    acc.feed(b'x"usage":{"prompt_tokens":1}}\n', 0.0)  # the tail of the oversized line: skipped
    acc.feed(b'data: {"usage":{"prompt_tokens":7}}\n', 0.0)
    assert acc.finish() == obs(7, None, None)


def test_decode_seconds_from_first_non_empty_chunk() -> None:
    acc = SseUsageAccumulator()
    assert acc.decode_seconds(5.0) is None
    acc.feed(b"", 1.0)
    acc.feed(b"data: {}\n", 2.0)
    acc.feed(b"data: {}\n", 3.0)
    assert acc.decode_seconds(4.5) == pytest.approx(2.5)
