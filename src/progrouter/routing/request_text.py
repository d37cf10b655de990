"""The prompt-bearing parts of a generation body, per body shape: what the estimate and the routing text read.

Each API puts the prompt in different fields; one function per body shape names them, in the order the model
reads them, and both readers take them from there (``prompt_sections``):

- chat completions and Anthropic Messages (``messages``): ``system`` (a string or a list of text blocks,
  Messages only), ``tools``, then the messages with their content blocks (text, tool_use, tool_result,
  thinking);
- OpenAI Responses (``input`` / ``instructions``): ``instructions``, ``tools``, then ``input`` (a string or a
  list of items: messages, function calls and their outputs, reasoning summaries);
- completions and generate: ``prompt`` / ``text``.

The prompt-size estimate (``agents.token_estimator.prompt_bytes``) measures every section. The routing text
(``routing_text``) — what cache-aware routing keys on, the text a worker's prefix cache sees first — leaves
the tool definitions out: they are the same on every request of a harness and carry no conversation, and
upstream's routing text has none. So two requests that differ in ``max_tokens`` or ``stream`` but share a
conversation share a prefix.

The walk keeps its own stack instead of recursing: a client controls how deep ``content`` nests, and each
value is visited once, so any depth costs time linear in the body and never a ``RecursionError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import orjson

# The keys of a content part, block or item whose values are text the model reads.
_PART_KEYS = ("text", "thinking", "content", "input", "arguments", "output", "summary")

TOOLS = "tools"
MESSAGES = "messages"  # a list whose entries' roles are part of the text
TEXT = "text"  # any other prompt value: a string, a list of parts, a block


class Section(NamedTuple):
    """One prompt-bearing field of a body: its kind (``TOOLS``, ``MESSAGES`` or ``TEXT``) and value."""

    kind: str
    value: Any


def _messages_shape(body: Mapping[str, Any]) -> list[Section]:
    """Chat completions and Anthropic Messages: system, tools, messages."""
    return [
        Section(TEXT, body.get("system")),
        Section(TOOLS, body.get("tools")),
        Section(MESSAGES, body["messages"]),
    ]


def _responses_shape(body: Mapping[str, Any]) -> list[Section]:
    """OpenAI Responses: instructions, tools, input (a string or a list of items)."""
    return [
        Section(TEXT, body.get("instructions")),
        Section(TOOLS, body.get("tools")),
        Section(MESSAGES, body.get("input")),
    ]


def _prompt_shape(body: Mapping[str, Any]) -> list[Section]:
    """Completions and generate: the prompt, or generate's text."""
    return [Section(TEXT, body.get("prompt")), Section(TEXT, body.get("text"))]


def prompt_sections(body: Mapping[str, Any]) -> list[Section]:
    """The prompt-bearing sections of ``body`` in reading order, by its shape (absent ones are None)."""
    if "messages" in body:
        return _messages_shape(body)
    if "input" in body or "instructions" in body:
        return _responses_shape(body)
    return _prompt_shape(body)


def _content(value: Any, out: list[str]) -> None:
    """Append the text of a content value: a string, a part, a block, an item, or a list of them."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, Mapping):
            if item.get("type") == "tool_use" and isinstance(item.get("input"), Mapping):
                out.append(_json_text(item["input"]))  # the call's arguments, as the template renders them
                continue
            stack.extend(item[key] for key in reversed(_PART_KEYS) if key in item)


def _json_text(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # not JSON (a body is parsed JSON, so only a caller's own object)
        return ""


def _turns(value: Any, out: list[str]) -> None:
    """Append a list of messages or items, each with its role (a string input is text as it is)."""
    if not isinstance(value, list):
        _content(value, out)
        return
    for entry in value:
        if isinstance(entry, Mapping):
            role = entry.get("role")
            if isinstance(role, str):
                out.append(role)
        _content(entry, out)


def routing_text(body: Mapping[str, Any] | None) -> str:
    """Prompt text of a chat, completions, responses, messages or generate body ("" if none)."""
    if body is None:
        return ""
    out: list[str] = []
    for kind, value in prompt_sections(body):
        if value is None or kind == TOOLS:
            continue
        if kind == MESSAGES:
            _turns(value, out)
        else:
            _content(value, out)
    return "\n".join(out)
