"""Targets: a worker URL, or one data-parallel Rank of it (written ``http://host:port@rank``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class Target:
    """One place a request can be sent. ``dp_rank`` is None when the worker has a single Rank (no header)."""

    id: str
    base_url: str
    dp_rank: int | None = None

    @classmethod
    def parse(cls, target_id: str) -> Target:
        """Parse ``http://host:port`` or ``http://host:port@rank``."""
        scheme_end = target_id.find("://")
        at = target_id.rfind("@")
        if at > scheme_end >= 0 and target_id[at + 1 :].isdigit():
            return cls(target_id, target_id[:at].rstrip("/"), int(target_id[at + 1 :]))
        return cls(target_id.rstrip("/"), target_id.rstrip("/"), None)

    @property
    def rank(self) -> int:
        """The vLLM ``engine`` label this target maps to (0 without DP)."""
        return self.dp_rank or 0

    def headers(self) -> dict[str, str]:
        """Headers that steer a request to this Rank inside its worker."""
        return {} if self.dp_rank is None else {"X-data-parallel-rank": str(self.dp_rank)}


def expand_targets(worker_urls: Sequence[str], dp_size: int) -> list[Target]:
    """Each worker URL as-is when ``dp_size`` is 1, else expanded to Ranks ``@0..dp_size-1``."""
    out: list[Target] = []
    for url in worker_urls:
        base = url.rstrip("/")
        if dp_size <= 1:
            out.append(Target(base, base, None))
        else:
            out.extend(Target(f"{base}@{r}", base, r) for r in range(dp_size))
    return out
