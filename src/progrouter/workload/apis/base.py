"""What every API shape of the replay provides: a rendered request and a reader of its answer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from progrouter.workload.trace import TraceProgram, TraceRequest, TraceTask

ApiName = Literal["completions", "chat", "messages", "responses", "chat-session"]
API_NAMES: tuple[ApiName, ...] = ("completions", "chat", "messages", "responses", "chat-session")
#: The shapes that carry identity only in a harness's headers (never ``agentic_context``).
HEADER_IDENTITY_APIS: frozenset[ApiName] = frozenset({"messages", "responses", "chat-session"})


@dataclass(frozen=True, slots=True)
class RenderInput:
    """One trace request about to be sent: who sends it, which step it is and its request id."""

    task: TraceTask
    program: TraceProgram
    step: int
    request: TraceRequest
    request_id: str


@dataclass(frozen=True, slots=True)
class Rendered:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(slots=True)
class Usage:
    """What the answer reported: prompt tokens (cached included), cached prompt tokens, output tokens."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None


class StreamReader(Protocol):
    """Reads one answer's stream event by event (the JSON of each SSE ``data:`` line)."""

    usage: Usage
    error: str | None
    done: bool
    content_events: int

    def feed(self, event: Mapping[str, Any]) -> bool:
        """Take one event; True when it carried generated content (the first one times TTFT)."""
        ...

    def end_marker(self, payload: bytes) -> bool:
        """Whether a non-JSON ``data:`` payload ends the stream (``[DONE]``)."""
        ...


class ApiClient(Protocol):
    """Renders trace requests as one API's requests and makes a reader for each answer."""

    name: ApiName

    def render(self, item: RenderInput) -> Rendered: ...

    def reader(self) -> StreamReader: ...

    def forget(self, task_id: str) -> None:
        """Drop what was kept for a finished task."""
        ...


def count(value: Any) -> int | None:
    """A token count from a usage object: a non-negative int, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def error_text(value: Any) -> str:
    return str(value)[:300]
