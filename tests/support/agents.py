"""Concurrent agent loops against a router, and the tally of how every request ended.

Each request carries a unique ``X-Fault-Request-Id`` (the engine tap logs its arrivals), and ends as exactly
one of:

- ``completed``: a 2xx whose body is whole (JSON with ``choices``, or an SSE stream that reached ``[DONE]``);
- ``error``: an error status (>= 400), or a stream the router broke off visibly (the chunked body never
  terminated, so the client knows it is incomplete);
- ``aborted``: the client itself hung up (the disconnect scenarios);
- ``lost``: anything else — no status within the budget, a connection reset before any status, or a 2xx
  whose body ended cleanly but incomplete (a silent truncation). Lost must always be 0.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from support.tapped_engine import TAP_HEADER

MODEL = "emu"
Disconnect = Literal["pooled", "streaming", "between_turns"] | None
OUTCOMES = ("completed", "error", "aborted", "lost")


@dataclass(slots=True)
class Record:
    rid: str
    program: bool
    stream: bool
    started: float
    status: int | None = None
    outcome: str = "lost"
    detail: str = "no answer"
    first_byte: float | None = None  # monotonic time the first body byte reached this client
    elapsed: float | None = None  # None while the request is still going on


@dataclass
class Tally:
    records: list[Record] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        c = Counter(r.outcome for r in self.records)
        return {"requests": len(self.records), **{o: c[o] for o in OUTCOMES}}

    def lost(self) -> list[Record]:
        return [r for r in self.records if r.outcome == "lost"]

    def row(self, scenario: str) -> str:
        c = self.counts()
        cells = [scenario, *(str(c[k]) for k in ("requests", "completed", "error", "aborted", "lost"))]
        return "| " + " | ".join(cells) + " |"


@dataclass(frozen=True)
class AgentPlan:
    """One agent: ``turns`` requests whose context grows, streaming on every other turn."""

    name: str
    program: bool = True
    turns: int = 6
    base_words: int = 250
    growth_words: int = 40
    max_tokens: int = 16
    think_seconds: float = 0.05
    first_stream: bool = True
    start_seconds: float = 0.0
    disconnect: Disconnect = None
    context: dict[str, Any] = field(default_factory=dict)


def words(letter: str, n: int) -> str:
    """``n`` distinct-looking words (one emulator token each)."""
    return " ".join(f"{letter}{i % 1000:03d}" for i in range(n))


def body_for(plan: AgentPlan, turn: int, stream: bool) -> dict[str, Any]:
    content = words(plan.name[:1] or "x", plan.base_words + turn * plan.growth_words)
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"{plan.name} {content}"}],
        "max_tokens": plan.max_tokens,
    }
    if plan.program:
        ctx = {"program_id": plan.name, **plan.context}
        body["vllm_xargs"] = {"agentic_context": json.dumps(ctx)}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


_ids = itertools.count()


async def _read_stream(response: aiohttp.ClientResponse, record: Record, hang_up_early: bool) -> None:
    done = False
    async for line in response.content:
        if record.first_byte is None:
            record.first_byte = time.monotonic()
            if hang_up_early:
                record.outcome, record.detail = "aborted", "client hung up mid-stream"
                response.close()
                return
        if line.strip() == b"data: [DONE]":
            done = True
    record.outcome, record.detail = ("completed", "") if done else ("lost", "stream ended without [DONE]")


async def _read_json(response: aiohttp.ClientResponse, record: Record) -> None:
    data = await response.read()
    record.first_byte = time.monotonic()
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("choices"):
        record.outcome, record.detail = "completed", ""
    else:
        record.outcome, record.detail = "lost", f"2xx without a whole body: {data[:120]!r}"


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    *,
    program: bool,
    budget: float,
    tally: Tally,
    disconnect: Disconnect = None,
) -> Record:
    """POST one chat request and classify how it ended (see the module docstring)."""
    stream = bool(body.get("stream"))
    record = Record(f"r{next(_ids)}", program, stream, time.monotonic())
    tally.records.append(record)
    headers = {TAP_HEADER: record.rid}

    async def exchange() -> None:
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as response:
            record.status = response.status
            if response.status >= 400:
                record.first_byte = time.monotonic()
                text = await response.read()
                record.outcome, record.detail = "error", text[:200].decode(errors="replace")
            elif stream:
                await _read_stream(response, record, disconnect == "streaming")
            else:
                await _read_json(response, record)

    try:
        if disconnect == "pooled":
            try:
                await asyncio.wait_for(exchange(), 0.3)
            except TimeoutError:
                record.outcome, record.detail = "aborted", "client hung up while waiting"
        else:
            await asyncio.wait_for(exchange(), budget)
    except TimeoutError:
        record.outcome, record.detail = "lost", f"no whole answer within {budget} s"
    except aiohttp.ClientPayloadError as exc:  # chunked body never terminated: a visible break
        record.outcome, record.detail = "error", f"stream broken off: {exc!r}"
    except aiohttp.ClientError as exc:
        if record.status is not None and record.status < 400 and stream:
            record.outcome, record.detail = "error", f"stream broken off: {exc!r}"
        else:
            record.outcome, record.detail = "lost", f"no status: {exc!r}"
    record.elapsed = time.monotonic() - record.started
    return record


async def run_agent(url: str, plan: AgentPlan, tally: Tally, budget: float) -> None:
    """The agent's turns, one after another; a failed turn is simply followed by the next one.

    ``streaming`` hangs up on the first turn (it streams when ``first_stream``); ``pooled`` hangs up on
    every turn until one of its requests was still waiting when it did (a turn served quickly, because the
    pool happened to be short then, does not count); ``between_turns`` leaves after half its turns.
    """
    await asyncio.sleep(plan.start_seconds)
    hung_up_waiting = False
    async with aiohttp.ClientSession() as session:
        for turn in range(plan.turns):
            stream = (turn % 2 == 0) == plan.first_stream
            hang_up = (plan.disconnect == "streaming" and turn == 0) or (
                plan.disconnect == "pooled" and not hung_up_waiting
            )
            record = await send(
                session,
                url,
                body_for(plan, turn, stream),
                program=plan.program,
                budget=budget,
                tally=tally,
                disconnect=plan.disconnect if hang_up else None,
            )
            hung_up_waiting = hung_up_waiting or record.outcome == "aborted"
            if plan.disconnect == "between_turns" and turn == plan.turns // 2:
                return  # the agent goes away with its Program active and never comes back
            await asyncio.sleep(plan.think_seconds)


async def run_agents(url: str, plans: list[AgentPlan], budget: float, tally: Tally) -> None:
    await asyncio.gather(*(run_agent(url, plan, tally, budget) for plan in plans))
