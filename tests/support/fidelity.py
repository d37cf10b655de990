"""The prefix-cache fidelity scenario (``tests/data/fidelity_scenario.json``): emulator and vLLM tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCENARIO = Path(__file__).resolve().parents[1] / "data" / "fidelity_scenario.json"


def load_scenario() -> dict[str, Any]:
    scenario: dict[str, Any] = json.loads(SCENARIO.read_text())
    return scenario


def emulator_fields(scenario: dict[str, Any]) -> dict[str, Any]:
    """EngineConfig fields for an emulator that meets the scenario's ``requires``, fast (time_scale 1000)."""
    req = scenario["requires"]
    return {
        "time_scale": 1000.0,
        "block_size": scenario["block_size"],
        "num_blocks": req["min_num_gpu_blocks"],
        "max_model_len": req["min_max_model_len"],
        "vocab_size": req["min_vocab_size"],
    }
