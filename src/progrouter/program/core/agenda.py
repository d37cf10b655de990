"""The scheduler's work queue: which Ranks an event must look at before it returns. One owner, named methods.

Two reasons put a Rank on the agenda. Its *capacity changed* (the ledger moved, an observation arrived or
lapsed, its statistics moved): it gets capacity repair and a full scan of its queue. Or *candidates arrived*
(Programs were queued or re-keyed there): only those are planned, because every other candidate was already
refused against the very same Rank state. Diagnostics never touch it.

The agenda also keeps a Rank's last examination (its ``RankView``) until the Rank's capacity changes: while
the observation that view counted as fresh still is, new unforced candidates above its ``demand_limit`` are
refused without building the view again — the common arrival, queued behind a full Rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from progrouter.program.core.admission import RankView


class Agenda:
    __slots__ = ("_candidates", "_changed", "_examined")

    def __init__(self) -> None:
        self._changed: set[str] = set()
        self._candidates: set[str] = set()
        self._examined: dict[str, RankView] = {}

    def capacity_changed(self, rank_id: str) -> None:
        self._changed.add(rank_id)
        self._examined.pop(rank_id, None)

    def examined(self, view: RankView) -> None:
        """A scheduling pass examined the Rank through ``view`` (kept until its capacity changes)."""
        self._examined[view.rank_id] = view

    def last_examined(self, rank_id: str) -> RankView | None:
        """The Rank's last examination, if its capacity has not changed since."""
        return self._examined.get(rank_id)

    def candidates_arrived(self, rank_id: str) -> None:
        self._candidates.add(rank_id)

    def take(self) -> list[tuple[str, bool]]:
        """The Ranks on the agenda now (none: it is empty), in id order, each with whether it needs a full
        pass; their new candidates are taken (a Rank's pass only ever puts that Rank back on the agenda)."""
        changed, candidates = self._changed, self._candidates
        if not candidates:
            return [(t, True) for t in sorted(changed)] if changed else []
        due = [(t, t in changed) for t in sorted(changed | candidates)]
        candidates.clear()
        return due

    def settled(self, rank_id: str) -> None:
        """The Rank was examined against its current capacity state."""
        self._changed.discard(rank_id)

    def forget(self, rank_id: str) -> None:
        self._changed.discard(rank_id)
        self._candidates.discard(rank_id)
        self._examined.pop(rank_id, None)
