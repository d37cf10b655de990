"""EngineConfig: everything one emulated vLLM server is built from (the `progrouter engine` flags).

The cost coefficients are the router's own `PrefillCostModel` and `DecodeThroughputModel`, so the emulator and
the router's reference calibration agree by construction until someone passes different ones.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from progrouter.config import DecodeThroughputModel, PrefillCostModel
from progrouter.engine.kv_events import KVEventsConfig

DEFAULT_MAX_MODEL_LEN = 32768


class EngineConfig(BaseModel):
    """One emulated vLLM server with ``data_parallel_size`` Ranks; every Rank gets its own KV cache."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    model_name: str = "progrouter-emulated"
    data_parallel_size: int = Field(default=1, ge=1)
    num_blocks: int = Field(default=8192, ge=1)
    block_size: int = Field(default=16, ge=1)
    max_num_seqs: int = Field(default=256, ge=1)
    max_num_batched_tokens: int = Field(default=8192, ge=1)
    # Default: 32768, or one Rank's whole KV cache if that is smaller (so a small --num-blocks just works).
    max_model_len: int = Field(default=DEFAULT_MAX_MODEL_LEN, ge=2)
    time_scale: float = Field(default=1.0, gt=0)
    seed: int = 0
    fail_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    slow_factor: float = Field(default=1.0, gt=0)
    eos_probability: float = Field(default=0.0, ge=0.0, le=1.0)
    vocab_size: int = Field(default=32000, ge=16)
    prefill_cost_model: PrefillCostModel = Field(default_factory=PrefillCostModel)
    decode_throughput_model: DecodeThroughputModel = Field(default_factory=DecodeThroughputModel)
    # vLLM's --kv-events-config: publish the prefix cache's stored/removed/cleared blocks per Rank over ZMQ.
    kv_events_config: KVEventsConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_max_model_len(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("max_model_len") is None:
            blocks = data.get("num_blocks", cls.model_fields["num_blocks"].default)
            size = data.get("block_size", cls.model_fields["block_size"].default)
            if isinstance(blocks, int) and isinstance(size, int):
                data = {**data, "max_model_len": min(DEFAULT_MAX_MODEL_LEN, blocks * size)}
        return data

    @model_validator(mode="after")
    def _fits(self) -> EngineConfig:
        capacity = self.num_blocks * self.block_size
        if self.max_model_len > capacity:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) is larger than the KV cache of one Rank "
                f"({self.num_blocks} blocks x {self.block_size} = {capacity} tokens); "
                "raise --num-blocks or lower --max-model-len"
            )
        return self

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
