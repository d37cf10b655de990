"""The OpenAI-compatible request bodies vLLM accepts, as pydantic models with vLLM's field types.

Using vLLM's own types means a body vLLM rejects is rejected here with the same pydantic message — notably a
nested object inside ``vllm_xargs`` fails with "Input should be a valid string", because vLLM types it
``dict[str, str | int | float | list[str | int | float]]``. Unknown fields are accepted and ignored, as in
vLLM. Only the fields the emulator acts on are listed; sampling knobs are accepted and have no effect.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

XargValue = str | int | float | list[str | int | float]
TokenId = Annotated[int, Field(ge=0)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class _GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    n: int = 1
    seed: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: str | list[str] | None = None
    user: str | None = None
    cache_salt: str | None = Field(default=None, min_length=1)
    request_id: str | None = None
    vllm_xargs: dict[str, XargValue] | None = None


class CompletionRequest(_GenerationRequest):
    prompt: list[TokenId] | list[list[TokenId]] | str | list[str] | None = None
    max_tokens: int | None = 16
    echo: bool | None = False


class ChatCompletionRequest(_GenerationRequest):
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    tokens: list[TokenId]


def describe(exc: ValidationError) -> str:
    """One line per error, like vLLM's 400 body for a request that fails validation."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}" if loc else str(err["msg"]))
    return f"{exc.error_count()} validation error(s) for {exc.title}; " + "; ".join(parts)


def error_body(
    message: str, *, status: int = 400, err_type: str = "BadRequestError", param: str | None = None
) -> dict[str, Any]:
    """vLLM's ErrorResponse shape."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}
