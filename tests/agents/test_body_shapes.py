"""The prompt-bearing sections of each API's body, as the estimate measures them and the routing text reads
them: chat, Anthropic Messages, OpenAI Responses, completions."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from progrouter.agents.token_estimator import prompt_bytes
from progrouter.routing.request_text import MESSAGES, TEXT, TOOLS, prompt_sections, routing_text

pytestmark = pytest.mark.timeout(30)

TOOL_DEFS = [{"name": "Bash", "description": "run a command", "input_schema": {"type": "object"}}]
ANTHROPIC: dict[str, Any] = {
    "model": "m",
    "max_tokens": 512,
    "stream": True,
    "system": [
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be terse."},
    ],
    "tools": TOOL_DEFS,
    "metadata": {"user_id": '{"session_id":"s"}'},
    "messages": [
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "use ls", "signature": "x"},
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py b.py"}]},
    ],
}
RESPONSES: dict[str, Any] = {
    "model": "m",
    "stream": True,
    "instructions": "You are Codex.",
    "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
        {"type": "function_call", "name": "shell", "arguments": '{"cmd":"ls"}', "call_id": "c1"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.py b.py"},
    ],
    "reasoning": {"effort": "medium"},
}


def _bytes(value: Any) -> int:
    return len(value.encode()) if isinstance(value, str) else len(orjson.dumps(value))


def test_messages_sections_are_system_tools_messages() -> None:
    sections = prompt_sections(ANTHROPIC)
    assert [kind for kind, _ in sections] == [TEXT, TOOLS, MESSAGES]
    assert [value for _, value in sections] == [ANTHROPIC["system"], TOOL_DEFS, ANTHROPIC["messages"]]


def test_responses_sections_are_instructions_tools_input() -> None:
    sections = prompt_sections(RESPONSES)
    assert [value for _, value in sections] == [
        RESPONSES["instructions"],
        RESPONSES["tools"],
        RESPONSES["input"],
    ]


@pytest.mark.parametrize("body", [ANTHROPIC, RESPONSES], ids=["messages", "responses"])
def test_the_estimate_measures_the_sections_and_nothing_else(body: dict[str, Any]) -> None:
    expected = sum(_bytes(value) for _, value in prompt_sections(body) if value is not None)
    assert prompt_bytes(body, b"") == expected
    noisy = {**body, "max_tokens": 99_999, "metadata": {"user_id": "x" * 5000}, "temperature": 0.1}
    assert prompt_bytes(noisy, b"") == expected


def test_messages_routing_text_reads_blocks_in_order_without_tools() -> None:
    assert routing_text(ANTHROPIC).split("\n") == [
        "You are Claude Code.",
        "Be terse.",
        "user",
        "list files",
        "assistant",
        "use ls",
        '{"command":"ls"}',  # the tool call's arguments
        "user",
        "a.py b.py",
    ]


def test_responses_routing_text_reads_items_in_order_without_tools() -> None:
    assert routing_text(RESPONSES).split("\n") == [
        "You are Codex.",
        "user",
        "list files",
        '{"cmd":"ls"}',
        "a.py b.py",
    ]
    assert routing_text({"instructions": "i", "input": "plain"}) == "i\nplain"


def test_shared_conversation_shares_a_prefix_whatever_the_sampling() -> None:
    first = routing_text(ANTHROPIC)
    longer = {
        **ANTHROPIC,
        "max_tokens": 1,
        "messages": [*ANTHROPIC["messages"], {"role": "user", "content": "more"}],
    }
    assert routing_text(longer).startswith(first)
