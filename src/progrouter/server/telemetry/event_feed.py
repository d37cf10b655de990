"""The scheduling events an operator watches (admit, pause, TTL expiry, force resume, cross-Rank resume,
failover, the KV size to configure), kept in a bounded ring for the dashboard and ``progrouter top``.

Fed by the live ``SchedulerObserver`` (``PrometheusObserver``); only the names below and only bounded,
redacted fields are kept, so the feed can be shown to anyone who may read the diagnostics.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from typing import Any

# Event name -> the fields shown. Never a raw Program id: ``program`` is the redacted id.
SHOWN: Mapping[str, tuple[str, ...]] = {
    "program_admit": ("program", "target", "forced", "batch_gain", "required_tokens"),
    "program_pause": ("program", "target", "reason", "released_private_tokens"),
    "capacity_observation_fallback": ("target", "source", "observation_age_seconds"),
    "capacity_observation_recovered": ("target", "source"),
    "token_capacity_unset": ("base_url", "reported_kv_tokens_per_dp_rank", "max_active_programs_per_target"),
    "token_capacity_reported": ("target", "tokens", "previous"),
}
# Transition reasons that no event above already reports.
SHOWN_TRANSITIONS = frozenset({"cross_rank_resume", "health_failover", "paused_retention_release"})


class EventFeed:
    """A ring of the last ``capacity`` events, each with a sequence number readers resume from."""

    def __init__(self, capacity: int = 500) -> None:
        self._ring: deque[dict[str, Any]] = deque(maxlen=capacity)
        self._seq = 0

    @property
    def last_seq(self) -> int:
        return self._seq

    def event(self, name: str, fields: Mapping[str, Any]) -> None:
        shown = SHOWN.get(name)
        if shown is not None:
            self._append(name, {k: fields[k] for k in shown if k in fields})

    def transition(self, target: str, reason: str) -> None:
        if reason in SHOWN_TRANSITIONS:
            self._append(reason, {"target": target})

    def since(self, seq: int) -> list[dict[str, Any]]:
        """Events after ``seq`` still in the ring, oldest first."""
        if seq >= self._seq:
            return []
        return [e for e in self._ring if e["seq"] > seq]

    def _append(self, name: str, fields: dict[str, Any]) -> None:
        self._seq += 1
        self._ring.append({"seq": self._seq, "time": time.time(), "event": name, **fields})
