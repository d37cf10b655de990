"""Client-side API shapes of the replay: how a trace's turns are sent and how the answer is read.

One module per wire shape: ``openai`` (vLLM's ``/v1/completions`` and ``/v1/chat/completions`` with the
Program identity in ``vllm_xargs.agentic_context``), ``messages`` (the Anthropic Messages API as Claude Code
sends it), ``responses`` (the OpenAI Responses API as the Codex CLI sends it) and ``chat_session`` (chat
completions as OpenCode and OpenHands send them, API name ``chat-session``). The harness shapes carry
identity only in their harness's headers, as the agents do; ``conversation`` turns a Program's growing
prompts into the system prompt, task and tool exchanges those shapes need.
"""

from __future__ import annotations

from progrouter.workload.apis.base import API_NAMES, ApiClient, ApiName, RenderInput
from progrouter.workload.apis.factory import make_client

__all__ = ["API_NAMES", "ApiClient", "ApiName", "RenderInput", "make_client"]
