"""A Program's decision state as small records, each held by exactly one owner and replaced whole.

A record is an immutable tuple: its owner changes it by assigning a new one, so resetting a group of facts is
one assignment and can never be partial. Nobody else can assign one: the owner keeps it in a table of its
own, or — the lifecycle's records, read on every event — in the Program's ``LifecycleRecord``, which
everyone else sees through this read-only class (mypy rejects a write through it; only lifecycle.py holds
the writable subclass).

    record          owner            what it holds
    QueueEntry      queues.py        the Program's place in its Rank queue and its frozen demand there (in the
                                     queues' own table, not on the Program)
    ForceResume     force_resume.py  when its wait began and the force-resume deadline frozen then (in the
                                     ForceResumeKeeper's own table, not on the Program)
    ActingTTL       lifecycle.py     the acting TTL armed at its last idle boundary
    Pause           lifecycle.py     when and why it last gave its placement up
    Segment         lifecycle.py     the continuous segment it is serving: start and round counters
    SharedPrefix    lifecycle.py     the shared prefix observed at its last placement start, and its freshness
    Completions     lifecycle.py     what its completed requests left behind
    LifecycleRecord lifecycle.py     all of the lifecycle's: identity, step, hints, output reservation,
                                     context shrink count and the five records above (on the Program)
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from progrouter.program.types import ProgramIdentity, RequestHints


class PauseReason(StrEnum):
    TTL_EXPIRED = "ttl_expired"
    CAPACITY_REPAIR = "capacity_repair"
    MAX_SEGMENT_YIELD = "max_segment_yield"
    REQUEST_FAILED = "request_failed"
    REQUEST_CANCELLED = "request_cancelled"


#: a Program's place in its Rank queue (resume.py): tiers, order, program id, serial
QueueKey = tuple[int, int, int, float, float, str, int]


class QueueEntry(NamedTuple):
    """Set while the Program sits in a Rank queue; queued Programs' inputs are frozen until re-queued."""

    key: QueueKey
    required: int  # its private demand when (re)queued
    uncached: int  # its context beyond the shared prefix (what a cold start recomputes) when (re)queued
    forced_at: float  # its force-resume deadline (fixed while it waits; inf without one)


class ForceResume(NamedTuple):
    """Frozen when the Program starts waiting; gone when it is admitted or has nothing left to wait for."""

    queued_at: float
    deadline: float
    timeout: float
    active_remaining_rounds: int
    pool_remaining_rounds: int
    request_throughput_per_second: float


class ActingTTL(NamedTuple):
    """An idle Active Program keeps its placement until ``deadline`` (its tool call started at ``since``)."""

    since: float
    deadline: float


class Pause(NamedTuple):
    """A Paused Program's pause; ``reason`` is None for a new Program (never placed) and after rebinding
    keeps the reason it had. Admission clears the whole record (the segment-yield marker is one-shot)."""

    at: float
    reason: PauseReason | None


class Segment(NamedTuple):
    """The continuous segment: its start, rounds served, and rounds since the last TTL pause."""

    started_at: float | None = None
    served_rounds: int = 0
    ttl_pause_sampled_rounds: int = 0  # served_rounds when the last TTL pause sampled them
    rounds_since_ttl_pause: int = 0


class SharedPrefix(NamedTuple):
    """Tokens of the Program's context other Programs share, observed once per placement start (§3.15)."""

    tokens: int = 0
    observed: bool = False
    anchor_at: float | None = None
    fresh_until: float | None = None


class Completions(NamedTuple):
    """What the Program's completed requests left: how many, the last finish and its prompt size."""

    requests: int = 0
    last_finished_at: float | None = None
    last_context_tokens: int = 0


NO_SEGMENT = Segment()
NO_SHARED_PREFIX = SharedPrefix()
NO_COMPLETIONS = Completions()


class LifecycleRecord:
    """A Program's lifecycle facts, read-only: lifecycle.py's private subclass, the only one built, shadows
    each property with a writable slot (plain, a read costs what a slot costs; compiled, one native getter
    call)."""

    __slots__ = ()

    @property
    def identity(self) -> ProgramIdentity:  # the last request's identity
        raise NotImplementedError

    @property
    def step_id(self) -> int:
        raise NotImplementedError

    @property
    def last_hints(self) -> RequestHints:
        raise NotImplementedError

    @property
    def output_token_reservation(self) -> int | None:  # until its request completes
        raise NotImplementedError

    @property
    def context_shrink_observations(self) -> int:  # consecutive lower prompt observations
        raise NotImplementedError

    @property
    def acting_ttl(self) -> ActingTTL | None:
        raise NotImplementedError

    @property
    def pause(self) -> Pause | None:
        raise NotImplementedError

    @property
    def segment(self) -> Segment:
        raise NotImplementedError

    @property
    def shared_prefix(self) -> SharedPrefix:
        raise NotImplementedError

    @property
    def completions(self) -> Completions:
        raise NotImplementedError
