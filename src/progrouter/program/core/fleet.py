"""``Fleet``: the live Ranks (targets) of every model pool, as the shell last reported them.

The scheduler alone changes it (``set_ranks``); every other component reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from progrouter.routing.target import Target


class Fleet:
    __slots__ = ("pool_ranks", "rank_pools", "targets", "tracked_pools")

    def __init__(self) -> None:
        self.pool_ranks: dict[str, list[str]] = {}  # model pool -> sorted live rank ids
        self.targets: dict[str, Target] = {}  # every live target id of any pool
        self.rank_pools: dict[str, set[str]] = {}  # rank id -> the pools it serves
        self.tracked_pools: set[str] = set()  # pools that have seen Program traffic
