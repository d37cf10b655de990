"""The emulator tests' shared fixtures: a roomy engine at 1000× time and one HTTP session per test.

A module that needs another engine (a tiny KV, other blocks) overrides ``engine_defaults`` itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest


@pytest.fixture
def engine_defaults() -> dict[str, Any]:
    return {"time_scale": 1000.0, "num_blocks": 512, "max_model_len": 4096}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
