"""vLLM's OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions``, as the replay sends them.

The Program identity rides in ``vllm_xargs.agentic_context`` (a compact JSON string, the form stock vLLM
accepts) and the task in ``x-session-id`` (what native consistent hashing keys on); the request streams with
``include_usage`` and asks for exactly the trace's output tokens (``max_tokens = min_tokens``,
``ignore_eos``). Completions send token ids (exact prefixes); chat sends the prompt as one user message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from progrouter.workload.apis.base import ApiName, Rendered, RenderInput, Usage, count, error_text
from progrouter.workload.context import agentic_context
from progrouter.workload.prompts import PromptBuilder


class OpenAIClient:
    def __init__(self, name: ApiName, prompts: PromptBuilder, model: str, hint: float | None) -> None:
        if name not in ("completions", "chat"):
            raise ValueError(f"not an OpenAI API shape: {name}")
        self.name: ApiName = name
        self._prompts = prompts
        self._model = model
        self._hint = hint

    def render(self, item: RenderInput) -> Rendered:
        body: dict[str, Any] = {
            "model": self._model,
            "max_tokens": item.request.output_tokens,
            "min_tokens": item.request.output_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "vllm_xargs": {
                "agentic_context": agentic_context(
                    item.task, item.program, item.step, item.request_id, self._hint
                )
            },
        }
        task_id = item.task.task_id
        if self.name == "chat":
            text = self._prompts.text(task_id, item.request_id, item.request)
            body["messages"] = [{"role": "user", "content": text}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = self._prompts.token_ids(task_id, item.request_id, item.request)
            path = "/v1/completions"
        headers = {"content-type": "application/json", "x-session-id": task_id}
        return Rendered(path, headers, orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY))

    def reader(self) -> ChunkReader:
        return ChunkReader()

    def forget(self, task_id: str) -> None:
        return None


def chat_usage(usage: Mapping[str, Any], into: Usage) -> None:
    """An OpenAI ``usage`` object (completions and chat completions) into ``into``."""
    prompt = count(usage.get("prompt_tokens"))
    if prompt is not None:
        into.prompt_tokens = prompt
    output = count(usage.get("completion_tokens"))
    if output is not None:
        into.output_tokens = output
    details = usage.get("prompt_tokens_details") or {}
    cached = count(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    if cached is not None:
        into.cached_tokens = cached


@dataclass(slots=True)
class ChunkReader:
    """An OpenAI completion stream: ``choices`` chunks (text or delta content), a usage chunk, ``[DONE]``."""

    usage: Usage = field(default_factory=Usage)
    error: str | None = None
    done: bool = False
    content_events: int = 0

    def feed(self, event: Mapping[str, Any]) -> bool:
        if event.get("error"):
            self.error = error_text(event["error"])
        content = False
        for choice in event.get("choices") or []:
            piece = choice.get("text")
            if piece is None:
                piece = (choice.get("delta") or {}).get("content")
            if piece:
                content = True
                self.content_events += 1
        usage = event.get("usage")
        if isinstance(usage, Mapping):
            chat_usage(usage, self.usage)
        return content

    def end_marker(self, payload: bytes) -> bool:
        if payload == b"[DONE]":
            self.done = True
            return True
        return False
