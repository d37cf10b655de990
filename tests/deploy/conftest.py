"""Dashboard fixtures: emulator defaults matching the router's capacity (as the loopback tier's)."""

from __future__ import annotations

from typing import Any

import pytest

from integration.helpers import BLOCK, CAPACITY, ENGINE_BLOCKS, MODEL


@pytest.fixture
def engine_defaults() -> dict[str, Any]:
    return {
        "model_name": MODEL,
        "num_blocks": ENGINE_BLOCKS,
        "block_size": BLOCK,
        "max_model_len": CAPACITY,
        "time_scale": 20.0,
    }
