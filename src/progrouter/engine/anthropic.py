"""The Anthropic Messages API as vLLM serves it: request types, the conversion to chat messages, the answers.

vLLM turns a Messages request into a chat request and renders it with the chat template; so does the
emulator, so a conversation re-sent with one more turn hits the prefix cache exactly as chat does. The
conversion follows vLLM's: the top-level ``system`` (a string, or text blocks whose ``cache_control`` is
ignored) becomes one leading system message; ``tool_use`` blocks become the assistant's tool calls (input as
JSON); a user's ``tool_result`` blocks become tool messages placed before what remains of that user message;
``tools`` become chat function tools. vLLM reports the message id of the chat request (``chatcmpl-...``),
an ``input_tokens`` that excludes both cache shares, and omits ``stop_sequence`` when it is null in a full
answer. A body that fails validation gets vLLM's OpenAI-shaped 400; every later error is Anthropic-shaped.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from progrouter.engine.protocol import XargValue
from progrouter.engine.usage import TokenUsage

BILLING_HEADER = "x-anthropic-billing-header"  # Claude Code's per-request hash, stripped as vLLM strips it
Event = tuple[str, dict[str, Any]]


class ContentBlock(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal[
        "text",
        "image",
        "tool_use",
        "tool_result",
        "tool_reference",
        "thinking",
        "redacted_thinking",
        "tool_addition",
        "tool_removal",
    ]
    text: str | None = None
    id: str | None = None
    tool_use_id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    content: str | list[dict[str, Any]] | None = None
    thinking: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    description: str | None = None
    input_schema: dict[str, Any]


class CountTokensRequest(BaseModel):
    """``POST /v1/messages/count_tokens``: what is rendered, nothing generated."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[Message]
    system: str | list[ContentBlock] | None = None
    tools: list[Tool] | None = None

    @field_validator("model")
    @classmethod
    def _model_given(cls, v: str) -> str:
        if not v:
            raise ValueError("Model is required")
        return v


class MessagesRequest(CountTokensRequest):
    max_tokens: int
    stream: bool | None = False
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    vllm_xargs: dict[str, XargValue] | None = None

    @field_validator("max_tokens")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError("max_tokens must be positive")
        return v


# ---- request -> chat messages ------------------------------------------------------------------------------


def _system_text(content: str | list[ContentBlock]) -> str:
    if isinstance(content, str):
        return "" if content.startswith(BILLING_HEADER) else content
    return "".join(
        b.text for b in content if b.type == "text" and b.text and not b.text.startswith(BILLING_HEADER)
    )


def _tool_result_text(content: str | list[dict[str, Any]] | None) -> str:
    if isinstance(content, list):
        return "\n".join(str(item.get("text", "")) for item in content if item.get("type") == "text")
    return content or ""


def _convert_message(msg: Message, out: list[dict[str, Any]]) -> None:
    if msg.role == "system":
        text = _system_text(msg.content)
        if text:
            out.append({"role": "system", "content": text})
        return
    chat: dict[str, Any] = {"role": msg.role}
    if isinstance(msg.content, str):
        chat["content"] = msg.content
    else:
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for block in msg.content:
            if block.type == "text" and block.text:
                texts.append(block.text)
            elif block.type == "tool_use":
                function = {"name": block.name or "", "arguments": json.dumps(block.input or {})}
                calls.append({"id": block.id or "", "type": "function", "function": function})
            elif block.type == "tool_result" and msg.role == "user":
                tool_msg = {"role": "tool", "tool_call_id": block.tool_use_id or ""}
                out.append(tool_msg | {"content": _tool_result_text(block.content)})
            elif block.type == "tool_result":
                texts.append(f"Tool result: {block.content or ''}")
        if calls:
            chat["tool_calls"] = calls
        if texts:
            chat["content"] = texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]
    if not (msg.role == "user" and "content" not in chat):
        out.append(chat)


def to_chat(req: CountTokensRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The chat messages and function tools vLLM renders for ``req``."""
    messages: list[dict[str, Any]] = []
    system = _system_text(req.system) if req.system else ""
    if system:
        messages.append({"role": "system", "content": system})
    for msg in req.messages:
        _convert_message(msg, messages)
    tools = None
    if req.tools is not None:
        tools = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": {"type": "object", **t.input_schema},
                },
            }
            for t in req.tools
        ]
    return messages, tools


# ---- answers -----------------------------------------------------------------------------------------------


def usage_body(usage: TokenUsage) -> dict[str, int]:
    """``input_tokens`` is what was neither read from nor written to the prefix cache (vLLM's split)."""
    return {
        "input_tokens": usage.uncached,
        "output_tokens": usage.output,
        "cache_creation_input_tokens": usage.created,
        "cache_read_input_tokens": usage.cached,
    }


def stop_reason(finish_reason: str | None) -> str:
    return "max_tokens" if finish_reason == "length" else "end_turn"


def message_body(
    message_id: str, model: str, text: str, finish_reason: str, usage: TokenUsage
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "model": model,
        "stop_reason": stop_reason(finish_reason),
        "usage": usage_body(usage),
    }


def count_tokens_body(n_prompt: int) -> dict[str, Any]:
    return {"input_tokens": n_prompt, "context_management": {"original_input_tokens": n_prompt}}


def error_body(err_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": err_type, "message": message}}


class MessageStream:
    """The SSE events of one streamed message: ``message_start`` with the first tokens (no ping), one text
    block, then ``content_block_stop``, ``message_delta`` (stop reason, full usage) and ``message_stop``."""

    def __init__(self, message_id: str, model: str, n_prompt: int) -> None:
        self._id = message_id
        self._model = model
        self._n_prompt = n_prompt
        self._started = False
        self._block_open = False

    def head(self) -> list[Event]:
        return []

    def _start(self) -> list[Event]:
        if self._started:
            return []
        self._started = True
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self._model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._n_prompt, "output_tokens": 0},
        }
        return [("message_start", {"type": "message_start", "message": message})]

    def tokens(self, text: str) -> list[Event]:
        events = self._start()
        if not text:
            return events
        if not self._block_open:
            self._block_open = True
            block = {"type": "text", "text": ""}
            events.append(
                ("content_block_start", {"type": "content_block_start", "content_block": block, "index": 0})
            )
        delta = {"type": "text_delta", "text": text}
        events.append(("content_block_delta", {"type": "content_block_delta", "delta": delta, "index": 0}))
        return events

    def finish(self, finish_reason: str, usage: TokenUsage) -> list[Event]:
        events = self._start()
        if self._block_open:
            events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
        delta = {"stop_reason": stop_reason(finish_reason), "stop_sequence": None}
        events.append(
            ("message_delta", {"type": "message_delta", "delta": delta, "usage": usage_body(usage)})
        )
        events.append(("message_stop", {"type": "message_stop"}))
        return events
