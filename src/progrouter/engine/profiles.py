"""Engine profiles: one measured GPU/model (or CPU tier) as cost coefficients and KV tokens per Rank.

A profile is what ``--engine-profile NAME|calibration.json`` selects. It sets the emulator's step costs and KV
size and, for Program arms, the router's own ``prefill_cost_model`` / ``decode_throughput_model``, so router
and engine agree unless an experiment overrides one side. The built-in profiles ship as JSON next to this
module (``profiles/<name>.json``); a ``progrouter calibrate`` output file works too (its KV size is the
measured ``backend.kv_capacity_tokens``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from progrouter.config import DecodeThroughputModel, PrefillCostModel

PROFILE_FORMAT = "progrouter-engine-profile/1"
CALIBRATION_FORMAT = "progrouter-calibration/1"
BUILTIN = ("reference", "cpu-tiny", "h200-llama-8b", "h200-qwen-32b")

#: AgentInfer calibration.json key -> (router group, router field), as the spec's table lists them.
CALIBRATION_KEYS: dict[str, tuple[str, str]] = {
    "ttl_prefill_model_intercept_seconds": ("prefill_cost_model", "intercept_seconds"),
    "ttl_prefill_model_linear_seconds_per_1k_tokens": ("prefill_cost_model", "linear_seconds_per_1k_tokens"),
    "ttl_prefill_model_quadratic_seconds_per_1k_tokens_squared": (
        "prefill_cost_model",
        "quadratic_seconds_per_1k_tokens_squared",
    ),
    "decode_step_fixed_seconds": ("decode_throughput_model", "fixed_step_seconds"),
    "decode_step_seconds_per_request": ("decode_throughput_model", "batch_step_seconds_per_request"),
    "decode_step_seconds_per_context_token": ("decode_throughput_model", "context_step_seconds_per_token"),
}


class ProfileError(ValueError):
    """An unknown profile name or an unusable profile/calibration file; the message says which."""


@dataclass(frozen=True, slots=True)
class EngineProfile:
    name: str
    description: str
    kv_tokens_per_rank: int
    prefill_cost_model: PrefillCostModel
    decode_throughput_model: DecodeThroughputModel
    max_model_len: int | None = None  # None: the engine's own default
    block_size: int = 16

    def num_blocks(self, block_size: int) -> int:
        """KV blocks of ``block_size`` tokens per Rank (at least one)."""
        return max(1, self.kv_tokens_per_rank // block_size)

    def engine_fields(self, block_size: int | None = None) -> dict[str, Any]:
        """The ``EngineConfig`` fields this profile sets (block size: given, else the profile's)."""
        size = block_size or self.block_size
        blocks = self.num_blocks(size)
        out: dict[str, Any] = {"block_size": size, "num_blocks": blocks, **self.cost_models()}
        if self.max_model_len is not None:
            out["max_model_len"] = min(self.max_model_len, blocks * size)
        return out

    def cost_models(self) -> dict[str, Any]:
        """``{"prefill_cost_model": ..., "decode_throughput_model": ...}`` as router config JSON."""
        return {
            "prefill_cost_model": self.prefill_cost_model.model_dump(mode="json"),
            "decode_throughput_model": self.decode_throughput_model.model_dump(mode="json"),
        }


def with_cost_models(
    config: dict[str, Any], prefill: PrefillCostModel, decode: DecodeThroughputModel
) -> dict[str, Any]:
    """A Program config with these cost models under whatever ``config`` sets itself, so the router models
    the engine it routes to unless the experiment says otherwise."""
    out = dict(config)
    for group, model in (("prefill_cost_model", prefill), ("decode_throughput_model", decode)):
        given = config.get(group)
        dumped = model.model_dump(mode="json")
        out[group] = {**dumped, **given} if isinstance(given, dict) else dumped
    return out


def load_profile(spec: str) -> EngineProfile:
    """A built-in profile by name, or a profile / calibration JSON file by path."""
    if spec in BUILTIN:
        text = resources.files("progrouter.engine").joinpath("profiles", f"{spec}.json").read_text()
        return _from_document(json.loads(text), spec)
    path = Path(spec)
    if not path.is_file():
        raise ProfileError(
            f"unknown engine profile {spec!r}: expected one of {', '.join(BUILTIN)} or a JSON file path"
        )
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ProfileError(f"cannot read engine profile {path}: {exc}") from exc
    return _from_document(doc, str(path))


def calibration_cost_models(doc: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The six coefficients of a calibration.json as ``{group: {field: value}}``."""
    out: dict[str, dict[str, float]] = {"prefill_cost_model": {}, "decode_throughput_model": {}}
    for key, (group, name) in CALIBRATION_KEYS.items():
        value = doc.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ProfileError(f"calibration file lacks a number for {key!r}")
        out[group][name] = float(value)
    return out


def _from_document(doc: Any, where: str) -> EngineProfile:
    if not isinstance(doc, dict):
        raise ProfileError(f"{where}: not a JSON object")
    fmt = doc.get("format")
    try:
        if fmt == CALIBRATION_FORMAT:
            models = calibration_cost_models(doc)
            backend = doc.get("backend") or {}
            kv = backend.get("kv_capacity_tokens") if isinstance(backend, dict) else None
            if not isinstance(kv, int) or kv < 1:
                raise ProfileError(f"{where}: calibration file lacks backend.kv_capacity_tokens")
            return EngineProfile(
                name=where,
                description=f"calibrated on {backend.get('url', 'a backend')} ({backend.get('model', '?')})",
                kv_tokens_per_rank=kv,
                prefill_cost_model=PrefillCostModel(**models["prefill_cost_model"]),
                decode_throughput_model=DecodeThroughputModel(**models["decode_throughput_model"]),
                max_model_len=backend.get("max_model_len"),
            )
        if fmt == PROFILE_FORMAT:
            return EngineProfile(
                name=str(doc.get("name", where)),
                description=str(doc.get("description", "")),
                kv_tokens_per_rank=int(doc["kv_tokens_per_rank"]),
                prefill_cost_model=PrefillCostModel(**doc.get("prefill_cost_model", {})),
                decode_throughput_model=DecodeThroughputModel(**doc.get("decode_throughput_model", {})),
                max_model_len=doc.get("max_model_len"),
                block_size=int(doc.get("block_size", 16)),
            )
    except ProfileError:
        raise
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        raise ProfileError(f"{where}: invalid engine profile: {exc}") from exc
    raise ProfileError(f"{where}: format must be {PROFILE_FORMAT!r} or {CALIBRATION_FORMAT!r}, got {fmt!r}")
