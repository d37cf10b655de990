"""The emulator's fixed chat template: messages become one line of words, then the generation prompt.

Each message renders as ``<|ROLE|> CONTENT <|end|>`` (content parts of type text are joined with spaces;
other parts are skipped), messages are joined with spaces, and ``<|assistant|>`` is appended. Every marker is
a word, so it is one token of the word tokenizer, and the same conversation prefix always renders to the same
token prefix — which is what prefix caching across agent turns needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
            if part.get("type", "text") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise ChatTemplateError(f"messages[{index}].content: a text part needs a string 'text'")
                texts.append(text)
        return " ".join(texts)
    raise ChatTemplateError(f"messages[{index}].content must be a string, a list of parts or null")


def render_chat(messages: Sequence[Any], *, add_generation_prompt: bool = True) -> str:
    if not messages:
        raise ChatTemplateError("messages must be a non-empty list")
    parts = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"messages[{i}] must be an object")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ChatTemplateError(f"messages[{i}].role must be a non-empty string")
        parts.append(f"<|{role}|> {_content_text(message.get('content'), i)} <|end|>")
    if add_generation_prompt:
        parts.append("<|assistant|>")
    return " ".join(parts)
