"""What each `progrouter epp` response mode gives up, against `progrouter serve`, on the same replay.

One replay of agent Programs (each turn resends the whole conversation: the previous answer and a new
tool result appended), half of the turns streamed (SSE with usage), against a fresh emulator engine per
arm, through:

- ``serve``: `progrouter serve`, which reads every response's usage as it relays it;
- ``epp stream``: Envoy + `progrouter epp --epp-response-body stream` (every response chunk to the EPP);
- ``epp end``: Envoy + `progrouter epp --epp-response-body end` (no response body: no usage);
- ``epp end+counters``: the same with ``--epp-counter-usage`` (usage estimated from vLLM's counters).

Printed per arm: the scheduler's context estimate of a Program after each turn against the context the
worker reported (prompt + completion tokens of that turn), as a mean absolute error; the Rank's rolling
averages (prompt, cached, completion tokens) against the same averages of what the worker reported; the
token estimator's coefficient; and, for the EPP arms, the ext_proc messages per request by phase. The
replay is sequential and the emulator deterministic, so these figures do not depend on the machine's
load; CPU figures do, and come from bench/epp.py.

    .venv/bin/python bench/epp_usage.py [--programs 6] [--turns 12]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from prometheus_client import CollectorRegistry

from progrouter.config import ProgramSchedulingConfig, RouterConfig
from progrouter.engine import EngineConfig
from progrouter.engine.server import start_engine
from progrouter.epp.bootstrap import epp_bootstrap
from progrouter.epp.envoy import start_envoy
from progrouter.epp.metrics import PHASES
from progrouter.epp.service import start_epp
from progrouter.program import ProgramRef
from progrouter.server.runner import start_router

MODEL = "emu"
POOL = f"program:model:{MODEL}"
CHAT = "/v1/chat/completions"
CAPACITY = 60_000
# 4-letter words: one emulator token per 5 bytes (0.2 tokens/byte), so the estimator's default of 0.25 is
# off by a quarter until usage calibrates it (a real tokenizer is off by its own ratio).
WORD = "{letter}{n:03d}"


def words(letter: str, count: int, start: int) -> str:
    return " ".join(WORD.format(letter=letter, n=(start + i) % 1000) for i in range(count))


@dataclass
class Arm:
    """One replay's figures."""

    name: str
    context_errors: list[float] = field(default_factory=list)  # |estimate − truth| / truth, per turn
    truth: list[dict[str, int]] = field(default_factory=list)  # the worker's usage, per request
    rolling: dict[str, Any] = field(default_factory=dict)
    tokens_per_byte: float | None = None
    messages: dict[str, float] = field(default_factory=dict)
    requests: int = 0


@asynccontextmanager
async def _shell(kind: str, worker: str) -> AsyncIterator[tuple[str, str, CollectorRegistry | None]]:
    """(URL for clients, URL of /scheduling/diagnostics' host, the EPP's registry or None)."""
    program = ProgramSchedulingConfig(token_capacity_per_dp_rank=CAPACITY, metrics_interval_seconds=0.2)
    config = RouterConfig(
        worker_urls=[worker],
        port=0,
        prometheus_port=None,
        policy="round_robin",
        health_check_interval_secs=3600.0,
        program_scheduling=program,
        epp_response_body="stream" if kind in ("serve", "epp stream") else "end",
        epp_counter_usage=kind == "epp end+counters",
    )
    if kind == "serve":
        router = await start_router(config)
        try:
            yield router.url, router.url, None
        finally:
            await router.stop()
        return
    epp = await start_epp(config, admin_port=0)
    try:
        host, port = epp.grpc_address.rsplit(":", 1)
        envoy = await start_envoy(
            epp_bootstrap(
                (host, int(port)),
                queue_timeout_seconds=program.queue_timeout_seconds,
                request_timeout_seconds=60,
                max_request_bytes=1 << 24,
                response_body=config.epp_response_body,
            )
        )
        try:
            yield envoy.url, epp.admin_url, epp.registry
        finally:
            await envoy.stop()
    finally:
        await epp.stop()


async def _ask(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """The answer's text and usage (SSE: the usage chunk)."""
    async with session.post(url + CHAT, json=body) as response:
        assert response.status == 200, await response.text()
        if not body.get("stream"):
            data = await response.json()
            return data["choices"][0]["message"]["content"], _usage(data["usage"])
        text, usage = [], {}
        async for line in response.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            if chunk.get("usage"):
                usage = _usage(chunk["usage"])
            for choice in chunk.get("choices", []):
                text.append(choice.get("delta", {}).get("content") or "")
        return "".join(text), usage


def _usage(raw: dict[str, Any]) -> dict[str, int]:
    cached = (raw.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"prompt": raw["prompt_tokens"], "completion": raw["completion_tokens"], "cached": cached}


async def _program_entry(session: aiohttp.ClientSession, admin: str, program_id: str) -> dict[str, Any]:
    """The Program's diagnostics once its request has completed in the scheduler."""
    redacted = ProgramRef(POOL, program_id, 0).redacted_id()
    for _ in range(500):
        async with session.get(admin + "/scheduling/diagnostics") as response:
            d = await response.json()
        for r in d["ranks"]:
            for p in r["programs"]:
                if p["program"] == redacted and p["in_flight_requests"] == 0:
                    entry: dict[str, Any] = p
                    return entry
        await asyncio.sleep(0.01)
    raise RuntimeError("the Program never completed")


async def replay(kind: str, programs: int, turns: int) -> Arm:
    engine = await start_engine(
        EngineConfig.model_validate(
            {"port": 0, "model_name": MODEL, "num_blocks": 8192, "block_size": 16, "max_model_len": 16384,
             "time_scale": 50.0}
        )
    )  # fmt: skip
    arm = Arm(kind)
    try:
        async with _shell(kind, engine.url) as (url, admin, registry), aiohttp.ClientSession() as session:
            histories: list[list[dict[str, str]]] = [
                [{"role": "system", "content": words(chr(97 + p), 300, 0)}] for p in range(programs)
            ]
            for turn in range(turns):
                for p in range(programs):
                    program_id = f"agent-{p}"
                    histories[p].append(
                        {"role": "user", "content": words("t", 40 + 13 * (turn % 5), turn * 97)}
                    )
                    body: dict[str, Any] = {
                        "model": MODEL,
                        "messages": histories[p],
                        "max_tokens": 24 + 8 * (turn % 3),
                        "vllm_xargs": {
                            "agentic_context": orjson.dumps(
                                {"program_id": program_id, "kv_retention_ttl_seconds": 60}
                            ).decode()
                        },
                    }
                    if turn % 2:
                        body["stream"] = True
                        body["stream_options"] = {"include_usage": True}
                    answer, usage = await _ask(session, url, body)
                    histories[p].append({"role": "assistant", "content": answer})
                    arm.truth.append(usage)
                    arm.requests += 1
                    entry = await _program_entry(session, admin, program_id)
                    context = usage["prompt"] + usage["completion"]
                    arm.context_errors.append(abs(entry["estimated_context_tokens"] - context) / context)
            async with session.get(admin + "/scheduling/diagnostics") as response:
                d = await response.json()
            [rank] = d["ranks"]
            arm.rolling = rank["rolling"]
            estimation = {e["endpoint"]: e["tokens_per_byte"] for e in d["token_estimation"]}
            arm.tokens_per_byte = estimation.get(CHAT)
            if registry is not None:
                for phase in PHASES:
                    count = registry.get_sample_value("progrouter_epp_messages_total", {"phase": phase})
                    arm.messages[phase] = (count or 0.0) / arm.requests
    finally:
        await engine.stop()
    return arm


def _window_mean(arm: Arm, key: str) -> float:
    window = arm.truth[-int(arm.rolling.get("window_size") or len(arm.truth)) :]
    return statistics.fmean(u[key] for u in window)


def report(arms: list[Arm]) -> None:
    names = [a.name for a in arms]
    print(f"{'':44}" + "".join(f"{n:>18}" for n in names))

    def row(label: str, values: list[str]) -> None:
        print(f"{label:44}" + "".join(f"{v:>18}" for v in values))

    row("requests", [str(a.requests) for a in arms])
    row(
        "context estimate: mean |error| per turn",
        [f"{100 * statistics.fmean(a.context_errors):.1f} %" for a in arms],
    )
    row("context estimate: max |error|", [f"{100 * max(a.context_errors):.1f} %" for a in arms])
    for key, label in (("prompt", "avg_prompt_tokens"), ("cached", "avg_cached_prompt_tokens"),
                       ("completion", "avg_completion_tokens")):  # fmt: skip
        row(f"worker's {key} tokens (window mean)", [f"{_window_mean(a, key):.0f}" for a in arms])
        row(f"  scheduler's {label}", [f"{a.rolling.get(label) or 0:.0f}" for a in arms])
    row(
        "  scheduler's avg_cached_prompt_ratio",
        [f"{a.rolling.get('avg_cached_prompt_ratio') or 0:.3f}" for a in arms],
    )
    row(
        "token estimator tokens/byte (chat)",
        [f"{a.tokens_per_byte:.3f}" if a.tokens_per_byte else "uncalibrated" for a in arms],
    )
    for phase in PHASES:
        row(f"ext_proc {phase} / request", [f"{a.messages[phase]:.2f}" if a.messages else "–" for a in arms])
    row(
        "ext_proc messages / request",
        [f"{sum(a.messages.values()):.2f}" if a.messages else "–" for a in arms],
    )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--programs", type=int, default=6)
    parser.add_argument("--turns", type=int, default=12)
    args = parser.parse_args()
    kinds = ("serve", "epp stream", "epp end", "epp end+counters")
    arms = [await replay(kind, args.programs, args.turns) for kind in kinds]
    report(arms)


if __name__ == "__main__":
    asyncio.run(main())
