"""What vLLM answers on the agent-facing routes, as bytes: Anthropic Messages and OpenAI Responses, streamed
(SSE with ``event:`` lines) and whole, with the usage a test chooses."""

from __future__ import annotations

from typing import Any

import orjson


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def anthropic_usage(input_tokens: int, cache_read: int = 0, cache_creation: int = 0) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "cache_read_input_tokens": cache_read,
        "cache_creation_input_tokens": cache_creation,
        "output_tokens": 1,
    }


def anthropic_stream(
    input_tokens: int, cache_read: int = 0, cache_creation: int = 0, output_tokens: int = 3
) -> list[bytes]:
    """A Messages stream: ``message_start`` (prompt usage), one text block, ``message_delta`` (output
    usage), ``message_stop``."""
    usage = anthropic_usage(input_tokens, cache_read, cache_creation)
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": usage}
    return [
        _event("message_start", {"type": "message_start", "message": message}),
        _event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
        ),
        _event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": output_tokens},
            },
        ),
        _event("message_stop", {"type": "message_stop"}),
    ]


def anthropic_message(input_tokens: int, cache_read: int = 0, output_tokens: int = 3) -> dict[str, Any]:
    """A whole (non-streamed) Messages answer."""
    usage = anthropic_usage(input_tokens, cache_read)
    usage["output_tokens"] = output_tokens
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "usage": usage,
    }


def responses_usage(input_tokens: int, cached: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def responses_object(
    input_tokens: int, cached: int = 0, output_tokens: int = 3, status: str = "completed"
) -> dict[str, Any]:
    """A whole Responses answer (``usage`` None while it is in progress)."""
    done = status != "in_progress"
    return {
        "id": "resp_1",
        "object": "response",
        "status": status,
        "output": [],
        "usage": responses_usage(input_tokens, cached, output_tokens) if done else None,
    }


def responses_stream(input_tokens: int, cached: int = 0, output_tokens: int = 3) -> list[bytes]:
    """A Responses stream: ``response.created`` (no usage yet), a text delta, ``response.completed``."""
    return [
        _event(
            "response.created",
            {"type": "response.created", "response": responses_object(0, status="in_progress")},
        ),
        _event(
            "response.output_text.delta",
            {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "ok"},
        ),
        _event(
            "response.completed",
            {"type": "response.completed", "response": responses_object(input_tokens, cached, output_tokens)},
        ),
    ]
