"""The text of a request that a worker's prefix cache sees first: what cache-aware routing keys on.

Only the prompt-bearing fields are used, in the order the model reads them, so two requests that differ in
``max_tokens`` or ``stream`` but share a conversation share a prefix here too.

The walk keeps its own stack instead of recursing: a client controls how deep ``content`` nests, and each
value is visited once, so any depth costs time linear in the body and never a ``RecursionError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_PART_KEYS = ("text", "content", "input", "output")


def _content(value: Any, out: list[str]) -> None:
    """Append the text of an OpenAI/Anthropic content value: a string, a part, or a list of parts."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, Mapping):
            stack.extend(item[key] for key in reversed(_PART_KEYS) if key in item)


def routing_text(body: Mapping[str, Any] | None) -> str:
    """Prompt text of a chat, completions, responses, messages or generate body ("" if none)."""
    if body is None:
        return ""
    out: list[str] = []
    _content(body.get("system"), out)  # Anthropic messages: the system prompt comes first
    _content(body.get("instructions"), out)  # Responses API
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, Mapping):
                role = message.get("role")
                if isinstance(role, str):
                    out.append(role)
                _content(message.get("content"), out)
    for key in ("prompt", "input", "text"):
        _content(body.get(key), out)
    return "\n".join(out)
