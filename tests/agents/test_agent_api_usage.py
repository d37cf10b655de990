"""Usage from each agent API's answers — Anthropic Messages and OpenAI Responses, streamed and whole — read
once, and a stream's end (or its absence when cut) recognised in every SSE dialect."""

from __future__ import annotations

import orjson
import pytest

from progrouter.agents.usage import SseUsageAccumulator, parse_json_usage
from progrouter.program.types import UsageObservation
from support.agent_streams import anthropic_message, anthropic_stream, responses_object, responses_stream

pytestmark = pytest.mark.timeout(30)


def fed(chunks: list[bytes], *, split: int | None = None) -> SseUsageAccumulator:
    """An accumulator fed ``chunks`` as they are, or re-cut every ``split`` bytes."""
    acc = SseUsageAccumulator()
    data = b"".join(chunks)
    pieces = chunks if split is None else [data[i : i + split] for i in range(0, len(data), split)]
    for piece in pieces:
        acc.feed(piece, 0.0)
    return acc


@pytest.mark.parametrize("split", [None, 1, 7, 64])
def test_anthropic_stream_usage_prompt_cached_and_output(split: int | None) -> None:
    acc = fed(anthropic_stream(10, cache_read=30, cache_creation=20, output_tokens=9), split=split)
    assert acc.done  # message_stop went by
    assert acc.finish() == UsageObservation(prompt_tokens=60, completion_tokens=9, cached_tokens=30)


def test_anthropic_stream_cut_after_message_start_keeps_the_prompt_only() -> None:
    acc = fed(anthropic_stream(500, cache_read=100)[:3])
    assert not acc.done
    # message_start's own output_tokens (1) is all the output seen: the cut answer reports no more
    assert acc.finish() == UsageObservation(prompt_tokens=600, completion_tokens=1, cached_tokens=100)


def test_anthropic_stream_cut_before_message_start_reports_nothing() -> None:
    acc = fed([b'event: message_start\ndata: {"type":"message_st'])
    assert not acc.done
    assert acc.finish().empty


@pytest.mark.parametrize("split", [None, 1, 5, 33])
def test_responses_stream_usage_from_response_completed(split: int | None) -> None:
    acc = fed(responses_stream(1200, cached=1024, output_tokens=17), split=split)
    assert acc.done
    assert acc.finish() == UsageObservation(prompt_tokens=1200, completion_tokens=17, cached_tokens=1024)


def test_responses_stream_is_done_only_once_the_completed_data_line_is_in() -> None:
    """``done`` lets the proxy finish the ticket at once: it must not come before the usage it carries."""
    chunks = responses_stream(40, cached=8)
    last = chunks[-1]
    cut = last.index(b"\ndata:") + 1  # the event line alone
    acc = fed([*chunks[:-1], last[:cut]])
    assert not acc.done
    acc.feed(last[cut:], 0.0)
    assert acc.done
    assert acc.usage == UsageObservation(prompt_tokens=40, completion_tokens=3, cached_tokens=8)


def test_responses_stream_cut_before_completed_reports_no_usage() -> None:
    acc = fed(responses_stream(40)[:2])  # response.created carries "usage": null
    assert not acc.done and acc.finish().empty


def test_chat_stream_still_ends_at_done_and_anthropic_event_names_only_end_their_own_data_line() -> None:
    acc = fed([b'data: {"choices":[]}\n\n', b"data: [DONE]\n\n"])
    assert acc.done
    # a content block that mentions message_stop in its text is not the end
    text = orjson.dumps({"type": "content_block_delta", "delta": {"text": "event: message_stop"}})
    acc = fed([b"event: content_block_delta\ndata: " + text + b"\n\n"])
    assert not acc.done


def test_whole_answers_of_each_api() -> None:
    assert parse_json_usage(orjson.dumps(anthropic_message(10, cache_read=30, output_tokens=4))) == (
        UsageObservation(prompt_tokens=40, completion_tokens=4, cached_tokens=30)
    )
    assert parse_json_usage(orjson.dumps(responses_object(300, cached=256, output_tokens=5))) == (
        UsageObservation(prompt_tokens=300, completion_tokens=5, cached_tokens=256)
    )
