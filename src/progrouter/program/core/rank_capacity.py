"""``RankCapacities``: the logical KV-token capacity of each Rank, and where it comes from.

The spec's ``token_capacity_per_dp_rank`` is one number for every Rank, or null (the Program-count guard
only). ``"auto"`` (beyond the spec) takes each Rank's own size from what its vLLM reports
(``vllm:cache_config_info``): Ranks of one fleet may differ, and a worker that restarts with another
``--num-gpu-blocks`` reports another size. So the capacity is a per-Rank fact that changes at runtime, and
every formula reads it through ``CapacityLedger.capacity`` (which asks this table), never the config.

Until a Rank's size is reported it has no token capacity: it admits by the count guard alone, as under null.
A Rank that leaves forgets its size; on its return it is unknown again until its worker reports one (a
restarted worker may have another size). Memory: one integer per live Rank.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from progrouter.config import AUTO_TOKEN_CAPACITY


class TokenCapacitySource(StrEnum):
    """Which capacity is in force on a Rank (``/scheduling/diagnostics``' ``token_capacity_source``)."""

    CONFIGURED = "configured"  # token_capacity_per_dp_rank: an integer
    REPORTED = "reported"  # "auto", and the Rank's vLLM reported its KV size
    UNKNOWN = "unknown (count guard)"  # "auto", no size reported yet: the count guard alone
    UNSET = "unset (count guard)"  # null, the spec's default: the count guard alone


def watermark_tokens(capacity: int | None, ratio: float) -> float | None:
    """``C × ratio``, a watermark in tokens; None without token capacity (no token check at all)."""
    return None if capacity is None else capacity * ratio


class RankCapacities:
    """The configured capacity, or under ``"auto"`` the size each Rank reported."""

    __slots__ = ("_configured", "_reported", "auto")

    def __init__(self, setting: int | Literal["auto"] | None) -> None:
        self.auto = setting == AUTO_TOKEN_CAPACITY
        self._configured = setting if isinstance(setting, int) else None
        self._reported: dict[str, int] = {}  # "auto": rank id -> the KV tokens its vLLM reported

    def of(self, rank_id: str) -> int | None:
        """The Rank's token capacity in force; None: the count guard alone."""
        if self.auto:
            return self._reported.get(rank_id)
        return self._configured

    def source(self, rank_id: str) -> TokenCapacitySource:
        if self._configured is not None:
            return TokenCapacitySource.CONFIGURED
        if not self.auto:
            return TokenCapacitySource.UNSET
        if rank_id in self._reported:
            return TokenCapacitySource.REPORTED
        return TokenCapacitySource.UNKNOWN

    def report(self, rank_id: str, tokens: int) -> bool:
        """The Rank's vLLM reports ``tokens`` of KV; whether that changes the capacity in force (only
        ``"auto"`` follows reports, and a size that is not positive is no size)."""
        if not self.auto or tokens <= 0 or self._reported.get(rank_id) == tokens:
            return False
        self._reported[rank_id] = tokens
        return True

    def forget(self, rank_id: str) -> None:
        """The Rank left: its size is unknown again until its worker reports one."""
        self._reported.pop(rank_id, None)
