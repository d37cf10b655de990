"""Importers: other tools' agent traces turned into our trace model (`progrouter trace import --format F`).

Each importer is a function ``(paths, block_size) -> Trace``; ``block_size`` is used only by formats that do
not carry their own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from progrouter.workload.importers.agent_infer import load_agent_infer
from progrouter.workload.importers.kv_cache_tester import load_kv_cache_tester
from progrouter.workload.importers.mooncake import load_mooncake
from progrouter.workload.trace import Trace

Importer = Callable[[Sequence[Path], int | None], Trace]

IMPORTERS: dict[str, Importer] = {
    "kv-cache-tester": load_kv_cache_tester,
    "mooncake": load_mooncake,
    "agent-infer": load_agent_infer,
}

__all__ = ["IMPORTERS", "Importer", "load_agent_infer", "load_kv_cache_tester", "load_mooncake"]
