"""Chat completions as OpenCode and OpenHands send them: a conversation with tool calls, the session in a
header.

Requests: ``Authorization: Bearer`` and the session in ``x-session-id`` (the header a user configures on the
provider: neither harness sends one the router reads by itself). A subagent runs as its own session (OpenCode
starts a child session per subagent), named ``<session>:<agent>``. The body carries the system prompt as a
``system`` message, the task as a user message, per turn an assistant message with ``tool_calls`` and a
``tool`` message with the result, the harness's function ``tools``, and streams with ``include_usage``. No
Program identity rides in the body. The answer is an OpenAI chunk stream (``openai.ChunkReader``).
"""

from __future__ import annotations

from typing import Any

import orjson

from progrouter.workload.apis.base import ApiName, Rendered, RenderInput
from progrouter.workload.apis.conversation import Conversation, ConversationBuilder
from progrouter.workload.apis.openai import ChunkReader

PATH = "/v1/chat/completions"
SESSION_HEADER = "x-session-id"


def _tool(name: str, description: str, prop: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {prop: {"type": "string"}}, "required": [prop]}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


#: A few of OpenCode's tools, each with one string argument.
TOOLS: tuple[dict[str, Any], ...] = (
    _tool("bash", "Run a shell command.", "command"),
    _tool("read", "Read a file.", "filePath"),
    _tool("grep", "Search file contents.", "pattern"),
    _tool("task", "Run a subagent.", "prompt"),
)


class ChatSessionClient:
    name: ApiName = "chat-session"

    def __init__(self, conversations: ConversationBuilder, model: str, api_key: str | None = None) -> None:
        self._conversations = conversations
        self._model = model
        self._api_key = api_key or "progrouter-replay"

    def headers(self, item: RenderInput) -> dict[str, str]:
        return {
            "content-type": "application/json",
            "authorization": f"Bearer {self._api_key}",
            SESSION_HEADER: session_id(item),
        }

    def body(self, item: RenderInput, conversation: Conversation) -> dict[str, Any]:
        return {
            "model": self._model,
            "messages": chat_messages(conversation),
            "tools": list(TOOLS),
            "max_tokens": item.request.output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def render(self, item: RenderInput) -> Rendered:
        body = self.body(item, self._conversations.turn(item))
        return Rendered(PATH, self.headers(item), orjson.dumps(body))

    def reader(self) -> ChunkReader:
        return ChunkReader()

    def forget(self, task_id: str) -> None:
        self._conversations.forget(task_id)


def session_id(item: RenderInput) -> str:
    """The task's session for its lead; a subagent's own child session otherwise."""
    if item.program.parent_program_id is None:
        return item.task.task_id
    return f"{item.task.task_id}:{item.program.agent_id}"


def chat_messages(conversation: Conversation) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if conversation.system:
        out.append({"role": "system", "content": conversation.system})
    out.append({"role": "user", "content": conversation.task})
    for ex in conversation.exchanges:
        tool = TOOLS[ex.tool % len(TOOLS)]["function"]
        prop = next(iter(tool["parameters"]["properties"]))
        call_id = f"call_{ex.call_id}"
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": tool["name"], "arguments": orjson.dumps({prop: ex.argument}).decode()},
        }
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        out.append({"role": "tool", "tool_call_id": call_id, "content": ex.result})
    return out
