"""The OpenAI Responses API (``POST /v1/responses``) as the Codex CLI sends it, and its SSE answer.

Requests: ``Authorization: Bearer``, the session in ``session-id`` and, for a subagent's thread, its agent in
``thread-id``. The body carries ``instructions`` (the system prompt), the harness's function ``tools``,
``prompt_cache_key`` (the session), ``store: false``, ``stream: true`` and ``input``: the task as a user
message, then per turn a ``function_call`` item and its ``function_call_output``. ``max_output_tokens`` (the
trace's output length) is beyond what Codex sends, so a replay generates exactly the trace's tokens. No
Program identity rides in the body.

Answer: ``response.*`` events; content arrives as ``response.output_text.delta`` (or function-call argument
or reasoning deltas); the usage (``input_tokens`` with ``input_tokens_details.cached_tokens``,
``output_tokens``) comes with ``response.completed``, or ``response.incomplete`` when the output limit ended
it; ``response.failed`` and ``error`` fail the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from progrouter.workload.apis.base import ApiName, Rendered, RenderInput, Usage, count, error_text
from progrouter.workload.apis.conversation import Conversation, ConversationBuilder

PATH = "/v1/responses"
SESSION_HEADER = "session-id"
THREAD_HEADER = "thread-id"
ORIGINATOR = "codex_cli_rs"


def _tool(name: str, description: str, prop: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {prop: {"type": "string"}}, "required": [prop]}
    return {
        "type": "function",
        "name": name,
        "description": description,
        "strict": False,
        "parameters": schema,
    }


#: A few of the Codex CLI's tools, each with one string argument.
TOOLS: tuple[dict[str, Any], ...] = (
    _tool("shell", "Run a shell command.", "command"),
    _tool("apply_patch", "Apply a patch to files.", "input"),
    _tool("update_plan", "Update the task plan.", "plan"),
    _tool("view_image", "Attach a local image.", "path"),
)


class ResponsesClient:
    name: ApiName = "responses"

    def __init__(self, conversations: ConversationBuilder, model: str, api_key: str | None = None) -> None:
        self._conversations = conversations
        self._model = model
        self._api_key = api_key or "progrouter-replay"

    def headers(self, item: RenderInput) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "authorization": f"Bearer {self._api_key}",
            "originator": ORIGINATOR,
            SESSION_HEADER: item.task.task_id,
        }
        if item.program.parent_program_id is not None:
            headers[THREAD_HEADER] = item.program.agent_id
        return headers

    def body(self, item: RenderInput, conversation: Conversation) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model,
            "input": input_items(conversation),
            "tools": list(TOOLS),
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "store": False,
            "stream": True,
            "prompt_cache_key": item.task.task_id,
            "max_output_tokens": item.request.output_tokens,
        }
        if conversation.system:
            body["instructions"] = conversation.system
        return body

    def render(self, item: RenderInput) -> Rendered:
        body = self.body(item, self._conversations.turn(item))
        return Rendered(PATH, self.headers(item), orjson.dumps(body))

    def reader(self) -> ResponsesReader:
        return ResponsesReader()

    def forget(self, task_id: str) -> None:
        self._conversations.forget(task_id)


def input_items(conversation: Conversation) -> list[dict[str, Any]]:
    """The task as a user message, then per tool exchange a ``function_call`` and its output."""
    task = {"type": "input_text", "text": conversation.task}
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": [task]}]
    for ex in conversation.exchanges:
        tool = TOOLS[ex.tool % len(TOOLS)]
        prop = next(iter(tool["parameters"]["properties"]))
        call_id = f"call_{ex.call_id}"
        arguments = orjson.dumps({prop: ex.argument}).decode()
        items.append(
            {"type": "function_call", "call_id": call_id, "name": tool["name"], "arguments": arguments}
        )
        items.append({"type": "function_call_output", "call_id": call_id, "output": ex.result})
    return items


def response_usage(usage: Mapping[str, Any], into: Usage) -> None:
    """A Responses ``usage`` object into ``into`` (its input tokens include the cached ones)."""
    prompt = count(usage.get("input_tokens"))
    if prompt is not None:
        into.prompt_tokens = prompt
    details = usage.get("input_tokens_details")
    if isinstance(details, Mapping):
        cached = count(details.get("cached_tokens"))
        if cached is not None:
            into.cached_tokens = cached
    output = count(usage.get("output_tokens"))
    if output is not None:
        into.output_tokens = output


def read_response(obj: Mapping[str, Any]) -> Usage:
    """The usage of a non-streamed answer (a ``response`` object)."""
    usage = Usage()
    raw = obj.get("usage")
    if isinstance(raw, Mapping):
        response_usage(raw, usage)
    return usage


_CONTENT_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
    }
)
_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete"})


@dataclass(slots=True)
class ResponsesReader:
    usage: Usage = field(default_factory=Usage)
    error: str | None = None
    done: bool = False
    content_events: int = 0

    def feed(self, event: Mapping[str, Any]) -> bool:
        kind = event.get("type")
        if kind in _CONTENT_EVENTS:
            if event.get("delta"):
                self.content_events += 1
                return True
        elif kind in _FINAL_EVENTS:
            self.done = True
            response = event.get("response")
            if isinstance(response, Mapping) and isinstance(response.get("usage"), Mapping):
                response_usage(response["usage"], self.usage)
            if kind == "response.incomplete":
                reason = _incomplete_reason(response)
                if reason != "max_output_tokens":
                    self.error = error_text(f"response incomplete: {reason}")
        elif kind == "response.failed":
            response = event.get("response")
            err = response.get("error") if isinstance(response, Mapping) else None
            self.error = error_text(err or "response failed")
            self.done = True
        elif kind == "error":
            self.error = error_text(event.get("error") or event.get("message") or event)
        return False

    def end_marker(self, payload: bytes) -> bool:
        return False


def _incomplete_reason(response: Any) -> str | None:
    if not isinstance(response, Mapping):
        return None
    details = response.get("incomplete_details")
    return str(details.get("reason")) if isinstance(details, Mapping) else None
