"""The vLLM-compatible engine emulator: a sans-I/O engine core per Rank, and an aiohttp server around it."""

from progrouter.engine.config import EngineConfig
from progrouter.engine.core import EngineCore, RequestOutput, RequestRejected, StepResult
from progrouter.engine.request import FinishReason, SamplingParams

__all__ = [
    "EngineConfig",
    "EngineCore",
    "FinishReason",
    "RequestOutput",
    "RequestRejected",
    "SamplingParams",
    "StepResult",
]
