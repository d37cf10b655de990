"""A short agent replay through Program scheduling on real vLLM under KV pressure: no errors, pool used."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from progrouter.workload.trace import load as load_trace
from support.factories import RouterFactory

from .conftest import BLOCK_SIZE, MAX_MODEL_LEN, NOTES, VOCAB_SIZE
from .helpers import diagnostics

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
# Half the engine's 16,384 KV tokens per Rank: ten ~3-6k-token agents on two Ranks cannot all be admitted.
CAPACITY = 8_192
TRACE_FLAGS = [
    "--tasks", "10", "--seed", "1", "--block-size", str(BLOCK_SIZE),
    "--system-prompt-tokens", "2000", "--task-prompt-tokens", "1000", "--turns-min", "3", "--turns-max", "5",
    "--tool-result-tokens", "300", "--output-tokens", "24", "--output-tokens-max", "48",
    "--max-context-tokens", str(MAX_MODEL_LEN - 2192), "--gap-median", "0.5", "--long-gap-prob", "0",
    "--subagent-prob", "0.2", "--task-interarrival", "0.1",
]  # fmt: skip


async def run(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "progrouter",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    return int(proc.returncode or 0), out.decode(errors="replace")


async def test_replay_under_kv_pressure_completes_and_retains(
    make_router: RouterFactory, tmp_path: Path
) -> None:
    trace, facts_path = tmp_path / "trace.jsonl", tmp_path / "facts.jsonl"
    code, out = await run("trace", "generate", "coding", "-o", str(trace), *TRACE_FLAGS)
    assert code == 0, out
    planned = load_trace(trace).num_requests

    router = await make_router({"token_capacity_per_dp_rank": CAPACITY, "metrics_interval_seconds": 0.25})
    replay = asyncio.create_task(
        run("replay", "--url", router.url, "--trace", str(trace), "--out", str(facts_path),
            "--vocab-size", str(VOCAB_SIZE), "--salt", uuid.uuid4().hex, "--quiet")
    )  # fmt: skip
    max_retained = 0
    async with aiohttp.ClientSession() as s:
        while not replay.done():
            max_retained = max(max_retained, (await diagnostics(s, router.url))["retained_requests"])
            await asyncio.wait([replay], timeout=0.05)
        final = await diagnostics(s, router.url)
    code, out = replay.result()
    assert code == 0, out

    facts = [json.loads(line) for line in facts_path.read_text().splitlines()]
    assert planned > 0 and len(facts) == planned
    assert [f for f in facts if f["status"] != "ok"] == []
    assert sum(f["cached_tokens"] or 0 for f in facts) > 0.5 * sum(f["prompt_tokens"] for f in facts)
    assert final["retained_requests"] == 0  # the pool drained

    # Requests were held in the RequestPool while their Programs could not be admitted.
    assert max_retained >= 1
    waits = _queue_waits(router.registry)
    assert waits["count"] == planned + _retries(router.registry)
    assert waits["longest"] > 0.005
    transitions = _transitions(router.registry)
    NOTES.append(
        f"replay: {planned} requests ok, max retained {max_retained}, longest wait {waits['longest']:.3f} s "
        f"(total wait {waits['sum']:.2f} s); transitions {transitions}"
    )


def _samples(registry: object, name: str) -> list[tuple[str, dict[str, str], float]]:
    text = generate_latest(registry).decode()  # type: ignore[arg-type]
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(name)
    ]


def _queue_waits(registry: object) -> dict[str, float]:
    rows = _samples(registry, "vllm_router_agent_aware_queue_wait_seconds")
    count = sum(v for n, _l, v in rows if n.endswith("_count"))
    longest = max((v for n, labels, v in rows if labels.get("quantile") == "1"), default=0.0)  # a summary
    total = sum(v for n, _l, v in rows if n.endswith("_sum"))
    return {"count": count, "longest": longest, "sum": total}


def _retries(registry: object) -> float:
    """Attempts sent again; a Program request's retry asks the gate again, so it waits (is observed) again."""
    return sum(v for n, _l, v in _samples(registry, "vllm_router_retries") if n.endswith("_total"))


def _transitions(registry: object) -> dict[str, float]:
    out: dict[str, float] = {}
    for n, labels, v in _samples(registry, "vllm_router_agent_aware_transitions"):
        if n.endswith("_total"):
            out[labels["reason"]] = out.get(labels["reason"], 0.0) + v
    return out
