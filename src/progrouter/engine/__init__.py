"""The vLLM-compatible engine emulator: a sans-I/O engine core per Rank, and an aiohttp server around it.

``start_engine`` / ``RunningEngine`` / ``EngineServer`` are loaded on first use, so importing the core (as the
simulator does) never imports aiohttp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from progrouter.engine.config import EngineConfig
from progrouter.engine.core import EngineCore, RequestOutput, RequestRejected, StepResult
from progrouter.engine.request import FinishReason, PromptBlocks, SamplingParams

if TYPE_CHECKING:
    from progrouter.engine.server import EngineServer, RunningEngine, start_engine

__all__ = [
    "EngineConfig",
    "EngineCore",
    "EngineServer",
    "FinishReason",
    "PromptBlocks",
    "RequestOutput",
    "RequestRejected",
    "RunningEngine",
    "SamplingParams",
    "StepResult",
    "start_engine",
]

_SERVER_NAMES = {"EngineServer", "RunningEngine", "start_engine"}


def __getattr__(name: str) -> Any:
    if name in _SERVER_NAMES:
        from progrouter.engine import server

        return getattr(server, name)
    raise AttributeError(f"module 'progrouter.engine' has no attribute {name!r}")
