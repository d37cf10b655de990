"""The Anthropic Messages API (``POST /v1/messages``) as Claude Code sends it, and its SSE answer.

Requests: ``anthropic-version``, ``x-api-key`` and the session in ``X-Claude-Code-Session-Id``; a subagent
adds ``X-Claude-Code-Agent-Id`` and ``X-Claude-Code-Parent-Agent-Id``. The body carries ``system`` as text
blocks marked ``cache_control``, the harness's ``tools``, ``metadata.user_id`` (a JSON string naming the
session), ``stream: true`` and the conversation: the task as the first user message, then per turn the
assistant's ``tool_use`` and a user message with its ``tool_result``; the last block is marked
``cache_control`` as Claude Code marks it. No Program identity rides in the body.

Answer: ``message_start`` (usage: uncached ``input_tokens``, ``cache_read_input_tokens``,
``cache_creation_input_tokens``), ``content_block_delta`` events (text, tool input JSON, thinking),
``message_delta`` (cumulative ``output_tokens``), ``message_stop``; an ``error`` event fails the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from progrouter.workload.apis.base import ApiName, Rendered, RenderInput, Usage, count, error_text
from progrouter.workload.apis.conversation import Conversation, ConversationBuilder

PATH = "/v1/messages"
ANTHROPIC_VERSION = "2023-06-01"
SESSION_HEADER = "X-Claude-Code-Session-Id"
AGENT_HEADER = "X-Claude-Code-Agent-Id"
PARENT_AGENT_HEADER = "X-Claude-Code-Parent-Agent-Id"
EPHEMERAL = {"type": "ephemeral"}


def _tool(name: str, description: str, prop: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {prop: {"type": "string"}}, "required": [prop]}
    return {"name": name, "description": description, "input_schema": schema}


#: A few of Claude Code's tools, each with one string argument.
TOOLS: tuple[dict[str, Any], ...] = (
    _tool("Bash", "Run a shell command.", "command"),
    _tool("Read", "Read a file.", "file_path"),
    _tool("Grep", "Search file contents.", "pattern"),
    _tool("Task", "Launch a subagent for a task.", "prompt"),
)


class MessagesClient:
    name: ApiName = "messages"

    def __init__(self, conversations: ConversationBuilder, model: str, api_key: str | None = None) -> None:
        self._conversations = conversations
        self._model = model
        self._api_key = api_key or "progrouter-replay"

    def headers(self, item: RenderInput) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "anthropic-version": ANTHROPIC_VERSION,
            "x-api-key": self._api_key,
            SESSION_HEADER: item.task.task_id,
        }
        parent = item.program.parent_program_id
        if parent is not None:
            headers[AGENT_HEADER] = item.program.agent_id
            parent_agent = next(p.agent_id for p in item.task.programs if p.program_id == parent)
            headers[PARENT_AGENT_HEADER] = parent_agent
        return headers

    def body(self, item: RenderInput, conversation: Conversation) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model,
            "max_tokens": item.request.output_tokens,
            "messages": messages(conversation),
            "tools": list(TOOLS),
            "metadata": {"user_id": orjson.dumps({"session_id": item.task.task_id}).decode()},
            "stream": True,
        }
        if conversation.system:
            body["system"] = [{"type": "text", "text": conversation.system, "cache_control": EPHEMERAL}]
        return body

    def render(self, item: RenderInput) -> Rendered:
        body = self.body(item, self._conversations.turn(item))
        return Rendered(PATH, self.headers(item), orjson.dumps(body))

    def reader(self) -> MessagesReader:
        return MessagesReader()

    def forget(self, task_id: str) -> None:
        self._conversations.forget(task_id)


def messages(conversation: Conversation) -> list[dict[str, Any]]:
    """The task, then per tool exchange the assistant's ``tool_use`` and the user's ``tool_result``."""
    out: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": conversation.task}]}]
    for ex in conversation.exchanges:
        tool = TOOLS[ex.tool % len(TOOLS)]
        prop = next(iter(tool["input_schema"]["properties"]))
        call_id = f"toolu_{ex.call_id}"
        use = {"type": "tool_use", "id": call_id, "name": tool["name"], "input": {prop: ex.argument}}
        out.append({"role": "assistant", "content": [use]})
        result = {"type": "tool_result", "tool_use_id": call_id, "content": ex.result}
        out.append({"role": "user", "content": [result]})
    last = out[-1]["content"][-1]
    out[-1]["content"][-1] = {**last, "cache_control": EPHEMERAL}
    return out


def message_usage(usage: Mapping[str, Any], into: Usage) -> None:
    """An Anthropic ``usage`` object into ``into``: the prompt is its uncached, cache-read and cache-written
    input tokens together; the cached tokens are the cache reads."""
    parts = [count(usage.get(k)) for k in ("input_tokens", "cache_read_input_tokens")]
    parts.append(count(usage.get("cache_creation_input_tokens")))
    if any(p is not None for p in parts):
        into.prompt_tokens = sum(p or 0 for p in parts)
    read = count(usage.get("cache_read_input_tokens"))
    if read is not None:
        into.cached_tokens = read
    output = count(usage.get("output_tokens"))
    if output is not None:
        into.output_tokens = output


def read_message(obj: Mapping[str, Any]) -> Usage:
    """The usage of a non-streamed answer (a ``message`` object)."""
    usage = Usage()
    raw = obj.get("usage")
    if isinstance(raw, Mapping):
        message_usage(raw, usage)
    return usage


_CONTENT_KEYS = ("text", "partial_json", "thinking")


@dataclass(slots=True)
class MessagesReader:
    usage: Usage = field(default_factory=Usage)
    error: str | None = None
    done: bool = False
    content_events: int = 0

    def feed(self, event: Mapping[str, Any]) -> bool:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            if isinstance(message, Mapping) and isinstance(message.get("usage"), Mapping):
                message_usage(message["usage"], self.usage)
        elif kind == "content_block_delta":
            delta = event.get("delta")
            if isinstance(delta, Mapping) and any(delta.get(k) for k in _CONTENT_KEYS):
                self.content_events += 1
                return True
        elif kind == "message_delta":
            usage = event.get("usage")
            if isinstance(usage, Mapping):
                _delta_usage(usage, self.usage)
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            self.error = error_text(event.get("error"))
        return False

    def end_marker(self, payload: bytes) -> bool:
        return False


def _delta_usage(usage: Mapping[str, Any], into: Usage) -> None:
    """``message_delta`` usage: the cumulative output tokens, and the input counts when it repeats them."""
    output = count(usage.get("output_tokens"))
    if any(k in usage for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")):
        message_usage(usage, into)
    if output is not None:
        into.output_tokens = output
