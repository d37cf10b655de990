"""Agent-harness sessions as traces, and what the scheduler's diagnostics must show after they ran.

A session is a lead whose context grows a tool result a turn, with a blocking subagent spawned after its
first turn. Any shell of the Program scheduler (``serve``, Envoy + ``epp``) in front of any engine (the
emulator, real vLLM) is checked the same way: each session and subagent became the Program the harness's
headers name, each Program stayed on one Rank, later turns read the earlier ones' prefix from the cache, and
the usage each Rank's rolling statistics recorded is exactly the usage the client saw.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from progrouter.program.core.diagnostics import redact
from progrouter.workload.apis import ApiName, RenderInput
from progrouter.workload.apis.chat_session import session_id
from progrouter.workload.facts import Fact
from progrouter.workload.trace import AgentRole, Trace, TraceProgram, TraceRequest, TraceTask

BLOCK = 16
SYSTEM = list(range(8))  # 128 tokens of system prompt every session shares


def _request(blocks: list[int], out: int) -> TraceRequest:
    return TraceRequest(len(blocks) * BLOCK, tuple(blocks), out, 0.0)


def session_task(
    task_id: str, *, turns: int = 4, grow: int = 6, base: int = 4, subagent: bool = True, out: int = 4
) -> TraceTask:
    """A lead whose context grows by ``grow`` blocks a turn (a tool result each), and a blocking subagent
    spawned after its first turn (two turns of its own)."""
    own = 1000 * (1 + int(task_id.lstrip("t")))
    lead = TraceProgram(
        f"{task_id}:lead",
        "lead",
        AgentRole.LEAD,
        tuple(_request([*SYSTEM, *range(own, own + base + grow * i)], out) for i in range(turns)),
    )
    if not subagent:
        return TraceTask(task_id, 0.0, (lead,))
    sub = TraceProgram(
        f"{task_id}:sub-1",
        "sub-1",
        AgentRole.SUBAGENT,
        tuple(_request([*SYSTEM, *range(own + 500, own + 502 + 3 * i)], out) for i in range(2)),
        parent_program_id=lead.program_id,
        blocks_parent=True,
        spawn_after=0,
    )
    return TraceTask(task_id, 0.0, (lead, sub))


def session_trace(tasks: int, **kw: Any) -> Trace:
    return Trace(BLOCK, tuple(session_task(f"t{i}", **kw) for i in range(tasks)), frozenset(SYSTEM))


def expected_key(api: ApiName, task: TraceTask, program: TraceProgram) -> tuple[str | None, str | None]:
    """(task, agent) of the Program the router derives from the harness's headers, redacted as the
    diagnostics show them."""
    if api == "chat-session":  # a subagent is a session of its own, with no agent header
        item = RenderInput(task, program, 0, program.requests[0], "")
        return redact(session_id(item)), None
    lead = program.parent_program_id is None  # a lead sends no agent header
    return redact(task.task_id), None if lead else redact(program.agent_id)


def listed_key(entry: Mapping[str, Any]) -> tuple[str | None, str | None]:
    return entry["task_id"], entry["agent_id"]


def listed(d: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every Program of a diagnostics snapshot, over all Ranks."""
    return [p for r in d["ranks"] for p in r["programs"]]


async def diagnostics(client: aiohttp.ClientSession, admin_url: str) -> dict[str, Any]:
    async with client.get(admin_url + "/scheduling/diagnostics") as response:
        assert response.status == 200
        data: dict[str, Any] = await response.json()
        return data


@dataclass(frozen=True)
class Turn:
    """What the client saw of one served request: whose it was and the usage it read."""

    program_id: str  # the trace's Program
    step_id: int
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int

    @classmethod
    def of_fact(cls, fact: Fact) -> Turn:
        assert fact.prompt_tokens is not None and fact.output_tokens is not None, fact
        cached = fact.cached_tokens or 0
        return cls(fact.program_id, fact.step_id, fact.prompt_tokens, fact.output_tokens, cached)


def check_programs_on_one_rank(api: ApiName, trace: Trace, d: Mapping[str, Any]) -> dict[str, str]:
    """The Programs the sessions became, each on one Rank; a harness subagent linked to its lead. Returns
    each trace Program's Rank (``target_id``)."""
    entries = {listed_key(e): e for e in listed(d)}
    wanted = {expected_key(api, t, p): p.program_id for t in trace.tasks for p in t.programs}
    assert sorted(entries, key=repr) == sorted(wanted, key=repr), list(entries)
    for entry in entries.values():
        assert entry["home_target"] == entry["last_target"]  # every turn went to the one Rank
        assert sum(entry in r["programs"] for r in d["ranks"]) == 1
    subs = [e for e in entries.values() if e["agent_role"] == "subagent"]
    subagents = sum(p.parent_program_id is not None for t in trace.tasks for p in t.programs)
    if api == "chat-session":  # a child session is a lead of its own
        assert subs == []
    else:  # a harness subagent is linked to its lead by the agent headers
        assert len(subs) == subagents
        leads = {redact(p.parent_program_id) for t in trace.tasks for p in t.programs if p.parent_program_id}
        assert {e["parent_program_id"] for e in subs} == leads
        assert all(e["blocks_parent"] for e in subs)
    return {program_id: str(entries[key]["last_target"]) for key, program_id in wanted.items()}


def check_cache_hits(turns: Iterable[Turn]) -> None:
    """Every later turn extends the last one on the same Rank: its prefix is read from the cache."""
    for turn in turns:
        if turn.step_id > 0:
            assert turn.cached_tokens > 0, turn


def check_exact_usage(d: Mapping[str, Any], placement: Mapping[str, str], turns: Iterable[Turn]) -> None:
    """Each Rank's rolling statistics hold exactly the usage its clients read: one sample per turn, and
    the same prompt, output and cached token counts."""
    per_rank: dict[str, list[Turn]] = {}
    for turn in turns:
        per_rank.setdefault(placement[turn.program_id], []).append(turn)
    for rank in d["ranks"]:
        mine = per_rank.pop(rank["target_id"], [])
        rolling = rank["rolling"]
        assert rolling["request_samples"] == len(mine), (rank["target_id"], rolling)
        if not mine:
            continue
        seen = {
            "avg_prompt_tokens": sum(t.prompt_tokens for t in mine) / len(mine),
            "avg_completion_tokens": sum(t.output_tokens for t in mine) / len(mine),
            "avg_cached_prompt_tokens": sum(t.cached_tokens for t in mine) / len(mine),
        }
        assert {k: rolling[k] for k in seen} == seen, (rank["target_id"], rolling, mine)
    assert not per_rank, per_rank  # no turn went to a Rank the diagnostics do not list
