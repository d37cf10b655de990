"""The OpenAI Responses API as vLLM serves it: the request type, the conversion to chat messages, the answers.

vLLM renders a Responses request through the chat template: ``instructions`` become a leading system message,
a string ``input`` one user message, and input items become chat messages as in vLLM's
``construct_chat_messages_with_tool_call`` (a ``function_call`` joins the preceding assistant message's tool
calls, a ``function_call_output`` is a tool message, a message item keeps its role and content parts). So does
the emulator, so a Codex conversation re-sent with its new items hits the prefix cache exactly as chat does.
Usage reports the whole prompt as ``input_tokens`` and the cache shares as ``input_tokens_details``
(``cached_tokens`` read, ``cache_write_tokens`` written). A response cut by ``max_output_tokens`` is
``status: "incomplete"``, and its stream still ends with ``response.completed``. Nothing is stored, so a
``previous_response_id`` is never found.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from progrouter.engine.protocol import XargValue
from progrouter.engine.usage import TokenUsage

Event = tuple[str, dict[str, Any]]


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str | None = None
    stream: bool | None = False
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool | None = True
    temperature: float | None = None
    top_p: float | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    vllm_xargs: dict[str, XargValue] | None = None


class InputItemError(ValueError):
    """An input item vLLM cannot turn into a chat message (400, parameter ``input``)."""


# ---- request -> chat messages ------------------------------------------------------------------------------


def _item_message(item: dict[str, Any], prev: dict[str, Any] | None) -> dict[str, Any] | None:
    """The chat message for ``item``; None when merged into ``prev`` (the last message, if an assistant's)."""
    kind = item.get("type")
    if kind in ("function_call", "custom_tool_call"):
        arguments = item.get("arguments", "") if kind == "function_call" else item.get("input") or ""
        call = {
            "id": item.get("call_id"),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": arguments},
        }
        if prev is not None:
            prev.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "reasoning":
        if item.get("encrypted_content"):
            raise InputItemError("Encrypted content is not supported.")
        parts = item.get("content") or item.get("summary") or []
        reasoning = parts[0].get("text", "") if parts and isinstance(parts[0], dict) else ""
        if prev is not None and prev.get("reasoning") is None:
            prev["reasoning"] = reasoning
            return None
        return {"role": "assistant", "reasoning": reasoning}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if item.get("role") == "assistant":
        content = item.get("content")
        text = content if isinstance(content, str) else None
        if isinstance(content, list) and content and isinstance(content[0], dict):
            text = content[0].get("text")
        if text is not None:
            if prev is not None and prev.get("content") is None:
                prev["content"] = text
                return None
            return {"role": "assistant", "content": text}
    if "role" in item:
        return {k: v for k, v in item.items() if k in ("role", "content")}
    raise InputItemError(f"Unsupported input item type: {kind}")


def to_chat(req: ResponsesRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The chat messages and function tools vLLM renders for ``req``."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
    else:
        for item in req.input:
            prev = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
            message = _item_message(item, prev)
            if message is not None:
                messages.append(message)
    tools = [
        {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
        for t in req.tools
        if t.get("type") == "function"
    ]
    return messages, tools or None


# ---- answers -----------------------------------------------------------------------------------------------


def usage_body(usage: TokenUsage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt,
        "input_tokens_details": {
            "cached_tokens": usage.cached,
            "cache_write_tokens": usage.created,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": usage.output,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": usage.prompt + usage.output,
    }


def _text_part(text: str, logprobs: list[Any] | None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def message_item(item_id: str, text: str | None) -> dict[str, Any]:
    """An assistant output message; ``text`` None: the in-progress item with no content yet."""
    content = [] if text is None else [_text_part(text, None)]
    status = "in_progress" if text is None else "completed"
    return {
        "id": item_id,
        "content": content,
        "role": "assistant",
        "status": status,
        "type": "message",
        "phase": None,
    }


class ResponseShape:
    """The response object of one request, in progress or final, with the request's echoed fields."""

    def __init__(
        self, req: ResponsesRequest, response_id: str, model: str, created_at: int, max_output_tokens: int
    ) -> None:
        self.req = req
        self.response_id = response_id
        self.model = model
        self.created_at = created_at
        self.max_output_tokens = max_output_tokens

    def body(
        self, output: list[dict[str, Any]], finish_reason: str | None, usage: TokenUsage | None
    ) -> dict[str, Any]:
        req = self.req
        if finish_reason is None:
            status, incomplete = "in_progress", None
        elif finish_reason == "length":
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        else:
            status, incomplete = "completed", None
        return {
            "id": self.response_id,
            "created_at": self.created_at,
            "incomplete_details": incomplete,
            "instructions": req.instructions,
            "metadata": req.metadata,
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "tool_choice": req.tool_choice if req.tools else "none",
            "tools": req.tools,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "background": False,
            "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": None,
            "previous_response_id": None,
            "prompt": None,
            "reasoning": None,
            "service_tier": "auto",
            "status": status,
            "text": None,
            "top_logprobs": None,
            "truncation": "disabled",
            "usage": None if usage is None else usage_body(usage),
            "user": req.user,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }


class ResponseStream:
    """The SSE events of one streamed response, numbered from 0 in ``sequence_number`` as vLLM numbers them:
    created and in_progress, then one output message (item added, part added, text deltas, text done, part
    done, item done) once there is text, then ``response.completed`` with the final response."""

    def __init__(self, shape: ResponseShape, item_id: str) -> None:
        self._shape = shape
        self._item_id = item_id
        self._seq = 0
        self._text: list[str] = []
        self._open = False

    def _event(self, kind: str, fields: dict[str, Any]) -> Event:
        event = (kind, {**fields, "sequence_number": self._seq, "type": kind})
        self._seq += 1
        return event

    def head(self) -> list[Event]:
        response = self._shape.body([], None, None)
        return [
            self._event("response.created", {"response": response}),
            self._event("response.in_progress", {"response": response}),
        ]

    def tokens(self, text: str) -> list[Event]:
        if not text:
            return []
        events = []
        at = {"item_id": self._item_id, "output_index": 0}
        if not self._open:
            self._open = True
            item = message_item(self._item_id, None)
            events.append(self._event("response.output_item.added", {"item": item, "output_index": 0}))
            part = _text_part("", [])
            events.append(
                self._event("response.content_part.added", {"content_index": 0, **at, "part": part})
            )
        self._text.append(text)
        delta = {"content_index": 0, "delta": text, **at, "logprobs": []}
        events.append(self._event("response.output_text.delta", delta))
        return events

    def finish(self, finish_reason: str, usage: TokenUsage) -> list[Event]:
        events = []
        output = []
        if self._open:
            text = "".join(self._text)
            at = {"item_id": self._item_id, "output_index": 0}
            done = {"content_index": 0, **at, "logprobs": [], "text": text}
            events.append(self._event("response.output_text.done", done))
            part = _text_part(text, None)
            events.append(self._event("response.content_part.done", {"content_index": 0, **at, "part": part}))
            item = message_item(self._item_id, text)
            events.append(self._event("response.output_item.done", {"item": item, "output_index": 0}))
            output = [item]
        response = self._shape.body(output, finish_reason, usage)
        events.append(self._event("response.completed", {"response": response}))
        return events
