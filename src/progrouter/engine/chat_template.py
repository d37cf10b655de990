"""The emulator's fixed chat template: tools and messages become one line of words, then the generation
prompt.

Each message renders as ``<|ROLE|> CONTENT <|end|>`` (content parts of type text, input_text or output_text
are joined with spaces; other parts are skipped); an assistant message's tool calls follow its content as
``<|tool_call|> NAME ARGUMENTS``. Tools, when given, come first as ``<|tools|> JSON... <|end|>`` (each tool's
function as JSON with sorted keys), where a real template declares them. Messages are joined with spaces and
``<|assistant|>`` is appended. Every marker is a word, so it is one token of the word tokenizer, and the same
conversation prefix always renders to the same token prefix — which is what prefix caching across agent turns
needs. The Messages and Responses APIs convert their requests to these chat messages and render them here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


class ChatTemplateError(ValueError):
    """The messages cannot be rendered (the server answers 400)."""


def _content_text(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict):
                raise ChatTemplateError(f"messages[{index}].content: each part must be an object")
            if part.get("type", "text") in TEXT_PART_TYPES:
                text = part.get("text")
                if not isinstance(text, str):
                    raise ChatTemplateError(f"messages[{index}].content: a text part needs a string 'text'")
                texts.append(text)
        return " ".join(texts)
    raise ChatTemplateError(f"messages[{index}].content must be a string, a list of parts or null")


def _tool_calls_text(calls: Any, index: int) -> str:
    if calls is None:
        return ""
    if not isinstance(calls, list):
        raise ChatTemplateError(f"messages[{index}].tool_calls must be a list")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise ChatTemplateError(f"messages[{index}].tool_calls: each call needs a 'function' object")
        out.append(f" <|tool_call|> {function.get('name', '')} {function.get('arguments', '')}")
    return "".join(out)


def _tools_text(tools: Sequence[Any]) -> str:
    specs = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ChatTemplateError(f"tools[{i}] must be an object")
        function = tool.get("function", tool)
        specs.append(json.dumps(function, sort_keys=True, ensure_ascii=False))
    return "<|tools|> " + " ".join(specs) + " <|end|>"


def render_chat(
    messages: Sequence[Any], *, add_generation_prompt: bool = True, tools: Sequence[Any] | None = None
) -> str:
    if not messages:
        raise ChatTemplateError("messages must be a non-empty list")
    parts = [_tools_text(tools)] if tools else []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"messages[{i}] must be an object")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ChatTemplateError(f"messages[{i}].role must be a non-empty string")
        content = _content_text(message.get("content"), i) + _tool_calls_text(message.get("tool_calls"), i)
        parts.append(f"<|{role}|> {content} <|end|>")
    if add_generation_prompt:
        parts.append("<|assistant|>")
    return " ".join(parts)
