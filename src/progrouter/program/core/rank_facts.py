"""``RankViews``: one Rank's admission facts now (``admission.RankView``), built from the table's per-Rank
indexes, the rolling statistics and the ledger — the three owners of what admission reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from progrouter.program.core.admission import RankView

if TYPE_CHECKING:
    from progrouter.config import ProgramSchedulingConfig
    from progrouter.program.core.factors import RankStats
    from progrouter.program.core.ledger import CapacityLedger
    from progrouter.program.core.table import ProgramTable


class RankViews:
    __slots__ = ("_config", "_ledger", "_stats", "_table")

    def __init__(
        self, config: ProgramSchedulingConfig, table: ProgramTable, stats: RankStats, ledger: CapacityLedger
    ) -> None:
        self._config = config
        self._table = table
        self._stats = stats
        self._ledger = ledger

    def of(self, rank_id: str, now: float) -> RankView:
        """The view of one Rank now."""
        observation, used = self._ledger.admission_facts(rank_id, now)
        return RankView(
            self._config,
            rank_id,
            self._table.ranks[rank_id],
            self._stats.get(rank_id),
            observation,
            used,
            self._ledger.capacity(rank_id),
        )
