"""The API client a replay uses for an ``--api`` name."""

from __future__ import annotations

from progrouter.workload.apis.base import API_NAMES, ApiClient, ApiName
from progrouter.workload.apis.chat_session import ChatSessionClient
from progrouter.workload.apis.conversation import ConversationBuilder
from progrouter.workload.apis.messages import MessagesClient
from progrouter.workload.apis.openai import OpenAIClient
from progrouter.workload.apis.responses import ResponsesClient
from progrouter.workload.prompts import PromptBuilder
from progrouter.workload.trace import Trace


def check_hint(api: ApiName, kv_retention_hint: float | None) -> None:
    """A KV retention hint rides in ``agentic_context``: the harness shapes have nowhere to put it."""
    if kv_retention_hint is not None and api not in ("completions", "chat"):
        raise ValueError(f"--kv-retention-hint needs --api completions or chat: {api} has no field for it")


def make_client(
    api: ApiName,
    trace: Trace,
    prompts: PromptBuilder,
    model: str,
    *,
    kv_retention_hint: float | None = None,
    api_key: str | None = None,
) -> ApiClient:
    """``completions``/``chat``: identity in the body; ``messages``/``responses``/``chat-session``: in the
    harness's headers."""
    check_hint(api, kv_retention_hint)
    if api in ("completions", "chat"):
        return OpenAIClient(api, prompts, model, kv_retention_hint)
    conversations = ConversationBuilder(prompts, trace.block_size, trace.shared_hash_ids)
    if api == "messages":
        return MessagesClient(conversations, model, api_key)
    if api == "responses":
        return ResponsesClient(conversations, model, api_key)
    if api == "chat-session":
        return ChatSessionClient(conversations, model, api_key)
    raise ValueError(f"unknown API {api!r}; known: {', '.join(API_NAMES)}")
