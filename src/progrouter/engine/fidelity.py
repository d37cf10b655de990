"""Run the prefix-cache fidelity scenario (``tests/data/fidelity_scenario.json``) against any server.

The scenario is data: ordered token-id prompts and the ``cached_tokens`` vLLM reports for each at block size
32. The same runner serves the emulator's test and the real-vLLM tier, so both sides are measured alike.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass(frozen=True)
class FidelityResult:
    name: str
    expected_cached_tokens: int
    cached_tokens: int | None
    prompt_tokens: int | None

    @property
    def ok(self) -> bool:
        return self.cached_tokens == self.expected_cached_tokens


async def run_fidelity_scenario(
    session: aiohttp.ClientSession,
    base_url: str,
    scenario: dict[str, Any],
    *,
    model: str | None = None,
    cache_salt: str | None = None,
    headers: dict[str, str] | None = None,
) -> list[FidelityResult]:
    """Send every request in order, one at a time; a fresh ``cache_salt`` isolates the run from old cache."""
    salt = cache_salt or f"fidelity-{uuid.uuid4().hex}"
    results = []
    for item in scenario["requests"]:
        body: dict[str, Any] = dict(scenario["request_template"])
        body |= {"prompt": item["prompt_token_ids"], "cache_salt": salt}
        if model is not None:
            body["model"] = model
        async with session.post(f"{base_url.rstrip('/')}/v1/completions", json=body, headers=headers) as resp:
            data = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"{item['name']}: HTTP {resp.status}: {data}")
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        results.append(
            FidelityResult(
                item["name"],
                item["expected_cached_tokens"],
                details.get("cached_tokens"),
                usage.get("prompt_tokens"),
            )
        )
    return results
