"""Claude Code's and Codex's sessions through ``progrouter serve`` (Program scheduling, enable key ``auto``)
in front of real vLLM with two DP Ranks: the harness headers become the Programs, later turns read the
earlier ones' prefix from vLLM's cache, and the usage the scheduler records is exactly what the client read.

Each session is a lead of three turns, each turn re-sending the conversation with a tool call and its result,
and a blocking subagent (Claude Code's agent headers, Codex's ``thread-id``) spawned after its first turn.

What differs between the two APIs on vLLM 0.32:

- Messages: vLLM takes ``X-data-parallel-rank`` there, so every turn of a Program runs on the Rank the
  scheduler chose (vLLM's per-engine prompt counters show it). Stock vLLM refuses Claude Code's ``tools``
  under the default auto tool choice unless started with ``--enable-auto-tool-choice --tool-call-parser``;
  the session server runs without a parser, so the turns send the tools with ``tool_choice`` none (they are
  still in the prompt, as Claude Code's are).
- Responses: vLLM ignores ``X-data-parallel-rank`` there and balances the turns over its engines itself,
  so the Rank the scheduler names is not where the turn runs. What holds: a turn that vLLM ran on an engine
  where an earlier turn of its Program ran reads that turn's prefix from the cache, and with three turns on
  two engines at least one later turn does.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest

from integration.helpers import wait_until
from progrouter.workload.apis import ApiName, RenderInput, make_client
from progrouter.workload.apis.base import ApiClient
from progrouter.workload.prompts import PromptBuilder
from progrouter.workload.trace import Trace, TraceProgram, TraceTask
from support.agent_sessions import (
    Turn,
    check_cache_hits,
    check_exact_usage,
    check_programs_on_one_rank,
    diagnostics,
    session_trace,
)
from support.factories import RouterFactory
from support.sse import read_named_events

from .conftest import KV_TOKENS_PER_RANK, MODEL_NAME, NOTES, VOCAB_SIZE, VllmServer
from .helpers import engine_counters

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
PROGRAM = {
    "enable_key": "auto",
    "token_capacity_per_dp_rank": KV_TOKENS_PER_RANK,
    "metrics_interval_seconds": 0.2,
}
Patch = Callable[[dict[str, Any]], dict[str, Any]]


def in_order(task: TraceTask) -> Iterator[tuple[TraceProgram, int]]:
    """The turns of a session one at a time: the lead's, each blocking subagent's after its spawn turn."""
    lead = task.lead
    for step in range(len(lead.requests)):
        yield lead, step
        for sub in task.programs:
            if sub.parent_program_id == lead.program_id and sub.spawn_after == step:
                yield from ((sub, s) for s in range(len(sub.requests)))


@dataclass(frozen=True)
class Served:
    """A turn the client read, and the engine (DP Rank) vLLM ran it on, from its per-engine counters."""

    turn: Turn
    engine: str


async def drive(
    http: aiohttp.ClientSession, url: str, vllm_url: str, api: ApiName, trace: Trace, patch: Patch
) -> list[Served]:
    """Send the session's turns as the harness renders them (``patch`` applied), each after the last."""
    prompts = PromptBuilder(trace, salt=uuid.uuid4().hex, vocab_size=VOCAB_SIZE)  # a fresh cache each run
    harness: ApiClient = make_client(api, trace, prompts, MODEL_NAME)
    served = []
    for task in trace.tasks:
        for program, step in in_order(task):
            request_id = f"{program.program_id}:{step}"
            rendered = harness.render(RenderInput(task, program, step, program.requests[step], request_id))
            body = orjson.dumps(patch(orjson.loads(rendered.body)))
            before = await engine_counters(http, vllm_url)
            async with http.post(url + rendered.path, data=body, headers=rendered.headers) as resp:
                assert resp.status == 200, await resp.text()
                events = await read_named_events(resp)
            reader = harness.reader()
            for _, event in events:
                reader.feed(event)
            assert reader.done and reader.error is None, events[-3:]
            usage = reader.usage
            assert usage.prompt_tokens and usage.output_tokens, usage
            turn = Turn(
                program.program_id, step, usage.prompt_tokens, usage.output_tokens, usage.cached_tokens or 0
            )
            served.append(Served(turn, await _engine_of(http, vllm_url, before, turn.prompt_tokens)))
    shown = ", ".join(
        f"{s.turn.program_id}#{s.turn.step_id}@{s.engine} {s.turn.cached_tokens}" for s in served
    )
    NOTES.append(f"{api} session on vLLM (turn@engine cached tokens): {shown}")
    return served


async def _engine_of(
    http: aiohttp.ClientSession, vllm_url: str, before: dict[str, dict[str, float]], prompt: int
) -> str:
    """The one engine whose prompt-token counter grew by the turn's prompt."""
    key = "vllm:prompt_tokens_total"
    after = await wait_until(
        lambda: engine_counters(http, vllm_url),
        lambda a: sum(a[e][key] - before[e][key] for e in a) >= prompt,
    )
    grew = {e: after[e][key] - before[e][key] for e in after}
    [engine] = [e for e, n in grew.items() if n > 0]
    assert grew[engine] == prompt, grew
    return engine


async def settled(http: aiohttp.ClientSession, router_url: str, requests: int) -> dict[str, Any]:
    """Diagnostics once every turn is completed (the router completes a stream a moment after its client)."""
    d: dict[str, Any] = await wait_until(
        lambda: diagnostics(http, router_url),
        lambda d: (
            sum(r["rolling"]["request_samples"] for r in d["ranks"]) == requests
            and all(r["router_in_flight_requests"] == 0 for r in d["ranks"])
        ),
    )
    return d


def no_tool_choice(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "tool_choice": {"type": "none"}}


async def test_claude_code_session_on_vllm_is_programs_on_their_ranks_with_cache_hits(
    make_router: RouterFactory, vllm_server: VllmServer
) -> None:
    router = await make_router(PROGRAM)
    trace = session_trace(1, turns=3)
    async with aiohttp.ClientSession() as http:
        served = await drive(http, router.url, vllm_server.url, "messages", trace, no_tool_choice)
        d = await settled(http, router.url, trace.num_requests)
    placement = check_programs_on_one_rank("messages", trace, d)
    turns = [s.turn for s in served]
    check_cache_hits(turns)
    check_exact_usage(d, placement, turns)
    for s in served:  # the Rank the scheduler chose is the engine vLLM ran the turn on
        assert placement[s.turn.program_id] == f"{vllm_server.url}@{s.engine}", (s.turn, placement)


async def test_codex_session_on_vllm_is_programs_with_exact_usage_but_unpinned_ranks(
    make_router: RouterFactory, vllm_server: VllmServer
) -> None:
    router = await make_router(PROGRAM)
    trace = session_trace(1, turns=3)
    async with aiohttp.ClientSession() as http:
        served = await drive(http, router.url, vllm_server.url, "responses", trace, lambda body: body)
        d = await settled(http, router.url, trace.num_requests)
    placement = check_programs_on_one_rank("responses", trace, d)  # where the scheduler placed them
    check_exact_usage(d, placement, [s.turn for s in served])
    # vLLM chose the engines itself: a turn on an engine its Program used before reads the earlier prefix
    ran: dict[str, set[str]] = {}
    rehits = 0
    for s in served:
        engines = ran.setdefault(s.turn.program_id, set())
        if s.engine in engines:
            assert s.turn.cached_tokens > 0, s.turn
            rehits += 1
        engines.add(s.engine)
    assert rehits >= 1  # the lead's three turns on two engines: two of them shared one
