"""Small HTTP helpers for the real-vLLM tier: vLLM's per-engine counters, SSE reading, diagnostics."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


async def engine_counters(session: aiohttp.ClientSession, base_url: str) -> dict[str, dict[str, float]]:
    """``{"0": {"vllm:prompt_tokens_total": ..., ...}, "1": {...}}`` from vLLM's /metrics (per ``engine``)."""
    async with session.get(base_url + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    wanted = {
        "vllm:prompt_tokens_total": "vllm:prompt_tokens",
        "vllm:prompt_tokens_cached_total": "vllm:prompt_tokens_cached",
        "vllm:num_requests_running": "vllm:num_requests_running",
        "vllm:num_requests_waiting": "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc": "vllm:kv_cache_usage_perc",
    }
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                out.setdefault(sample.labels["engine"], {})[sample.name] = sample.value
    return out


async def read_sse(resp: aiohttp.ClientResponse) -> tuple[list[dict[str, Any]], bool]:
    """All data events of a stream and whether it ended with ``[DONE]``."""
    events: list[dict[str, Any]] = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return events, True
        events.append(json.loads(data))
    return events, False


async def diagnostics(session: aiohttp.ClientSession, router_url: str) -> dict[str, Any]:
    async with session.get(router_url + "/scheduling/diagnostics") as resp:
        assert resp.status == 200, await resp.text()
        data: dict[str, Any] = await resp.json()
        return data


def agentic(program_id: str, **fields: Any) -> dict[str, Any]:
    """``vllm_xargs`` for a Program request: stock vLLM only takes the context as a JSON string."""
    return {"agentic_context": json.dumps({"program_id": program_id, **fields})}
