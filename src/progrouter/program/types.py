"""Value types shared by identity extraction, the scheduler core and the shells that drive it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class ScheduleError(Exception):
    """A request Program scheduling refuses; ``status`` is the HTTP status the shell answers with."""

    status: int = 500


class InvalidIdentity(ScheduleError):
    status = 400

    def __init__(self, reason: str) -> None:
        super().__init__(f"invalid Program identity: {reason}")
        self.reason = reason


class NoTargets(ScheduleError):
    status = 503

    def __init__(self) -> None:
        super().__init__("no healthy DP targets are available")


class PoolFull(ScheduleError):
    """The RequestPool holds ``max_pooled_requests``: a request that would wait is refused at once (429 with
    ``Retry-After``), so a burst cannot grow memory without bound. Nothing about the Program changes."""

    status = 429

    def __init__(self, limit: int) -> None:
        super().__init__(f"the Program request pool is full ({limit} requests waiting); retry later")


class QueueTimeout(ScheduleError):
    status = 429

    def __init__(self) -> None:
        super().__init__("Program request exceeded its admission queue timeout")


class ProgramIdentity(NamedTuple):
    """Who a request belongs to. ``program_id`` is the Program key within its model pool.

    A ``NamedTuple``, built once per Program request: a frozen dataclass sets each of its 14 fields
    through ``object.__setattr__`` (about 3x the cost)."""

    program_id: str
    placement_key: str
    placement_hash_key: str
    task_id: str | None = None
    session_id: str | None = None
    agent_id: str | None = None
    agent_role: str | None = None
    parent_program_id: str | None = None
    root_program_id: str | None = None
    blocks_parent: bool = False
    expected_resume: bool = True
    spawn_reason: str | None = None
    step_id: int | None = None
    source: str = "agentic_context"  # agentic_context | agent_hint | header:<schema>


class RequestHints(NamedTuple):
    """Request-scoped hints: they travel with exactly one RequestPool entry and its dispatch.

    A ``NamedTuple``, as ``ProgramIdentity``: built per request whose context string is new (a step id or
    request id changes it every time), where a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``."""

    request_id: str | None = None
    priority: int = 0
    deadline_seconds: float | None = None
    expected_output_tokens: int | None = None
    kv_retention_ttl_seconds: float | None = None


@dataclass(slots=True)
class UsageObservation:
    """Token usage a backend reported for one request. Fields only grow when merged (streams repeat usage)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None

    def merge(self, other: UsageObservation) -> None:
        self.prompt_tokens = _larger(self.prompt_tokens, other.prompt_tokens)
        self.completion_tokens = _larger(self.completion_tokens, other.completion_tokens)
        self.cached_tokens = _larger(self.cached_tokens, other.cached_tokens)

    @property
    def empty(self) -> bool:
        return self.prompt_tokens is None and self.completion_tokens is None and self.cached_tokens is None


def _larger(old: int | None, new: int | None) -> int | None:
    """The merged count: ``new`` when it is known and larger (or ``old`` is unknown)."""
    return old if new is None or (old is not None and new <= old) else new


@dataclass(frozen=True, slots=True)
class BackendObservation:
    """vLLM's own view of one Rank, scraped from ``/metrics`` (per ``engine`` label)."""

    kv_cache_usage: float
    running: int
    waiting: int
    extra: dict[str, float] = field(default_factory=dict)
    kv_capacity_tokens: int | None = None  # the Rank's KV size (vllm:cache_config_info), when on the page
