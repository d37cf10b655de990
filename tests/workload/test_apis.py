"""The replay's API shapes as pure functions: conversations, harness requests checked against the harness
fixtures (tests/data/harness), and the readers of each API's answer."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import orjson
import pytest

from progrouter.engine import anthropic
from progrouter.engine.chat_template import render_chat
from progrouter.engine.tokenizer import Tokenizer
from progrouter.workload.apis import RenderInput, make_client
from progrouter.workload.apis.base import Usage
from progrouter.workload.apis.conversation import ConversationBuilder
from progrouter.workload.apis.messages import MessagesClient, MessagesReader, read_message
from progrouter.workload.apis.openai import ChunkReader
from progrouter.workload.apis.responses import ResponsesClient, ResponsesReader, read_response
from progrouter.workload.prompts import PromptBuilder
from progrouter.workload.trace import AgentRole, Trace, TraceProgram, TraceTask

from .traces import req

HARNESS = Path(__file__).resolve().parents[1] / "data" / "harness"
BLOCK = 16


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads((HARNESS / f"{name}.json").read_bytes())
    return data


def _trace() -> Trace:
    """One task: a lead whose prompts grow (then get rewritten at step 3) and a subagent."""
    lead = TraceProgram(
        "t0:lead",
        "lead",
        AgentRole.LEAD,
        (req([0, 1, 10]), req([0, 1, 10, 11]), req([0, 1, 10, 11, 12]), req([0, 1, 40])),
    )
    sub = TraceProgram(
        "t0:sub-1",
        "sub-1",
        AgentRole.SUBAGENT,
        (req([0, 1, 20]), req([0, 1, 20, 21])),
        parent_program_id="t0:lead",
        blocks_parent=True,
        spawn_after=0,
    )
    return Trace(BLOCK, (TraceTask("t0", 0.0, (lead, sub)),), frozenset({0, 1}))


def _items(trace: Trace, program_id: str) -> list[RenderInput]:
    task = trace.tasks[0]
    program = next(p for p in task.programs if p.program_id == program_id)
    return [RenderInput(task, program, i, r, f"{program_id}:{i}") for i, r in enumerate(program.requests)]


def _bodies(api: str, program_id: str = "t0:lead") -> list[tuple[dict[str, str], dict[str, Any]]]:
    trace = _trace()
    client = make_client(api, trace, PromptBuilder(trace), "m")  # type: ignore[arg-type]
    out = []
    for item in _items(trace, program_id):
        rendered = client.render(item)
        out.append((rendered.headers, orjson.loads(rendered.body)))
    return out


def test_a_conversation_grows_by_tool_exchanges_and_restarts_when_rewritten() -> None:
    trace = _trace()
    prompts = PromptBuilder(trace)
    conv = ConversationBuilder(prompts, BLOCK, trace.shared_hash_ids)
    turns = [conv.turn(item) for item in _items(trace, "t0:lead")]
    assert len(turns[0].system.split()) == 2 * BLOCK  # the shared blocks are the system prompt
    assert len(turns[0].task.split()) == BLOCK
    assert [len(t.exchanges) for t in turns] == [0, 1, 2, 0]  # step 3 does not extend step 2
    assert len(turns[1].exchanges[0].result.split()) == BLOCK  # the tokens the prompt added
    assert turns[2].exchanges[:1] == turns[1].exchanges
    ids = [e.call_id for e in turns[2].exchanges]
    assert len(set(ids)) == len(ids)
    whole = prompts.text("t0", "t0:lead:2", trace.tasks[0].lead.requests[2]).split()
    t = turns[2]
    assert [*t.system.split(), *t.task.split(), *(w for e in t.exchanges for w in e.result.split())] == whole
    conv.forget("t0")
    assert len(conv.turn(_items(trace, "t0:lead")[1]).exchanges) == 0


@pytest.mark.parametrize(("api", "name"), [("messages", "claude_code"), ("responses", "codex")])
def test_harness_requests_have_the_fixture_shape(api: str, name: str) -> None:
    spec = fixture(name)
    assert spec["request"] == f"POST /v1/{api}"
    lead = _bodies(api)
    for headers, body in lead:
        assert {k.lower() for k in spec["headers"]} <= {k.lower() for k in headers}
        assert not {k.lower() for k in spec["subagent_headers"]} & {k.lower() for k in headers}
        assert "vllm_xargs" not in body and "agentic_context" not in orjson.dumps(body).decode()
        assert body["stream"] is spec["streaming"]
    first, second = spec["turns"]
    assert set(first) <= set(lead[0][1])  # every field the harness sends on a first turn
    assert set(second) <= set(lead[1][1])
    sub_headers = _bodies(api, "t0:sub-1")[0][0]
    assert {k.lower() for k in spec["subagent_headers"]} <= {k.lower() for k in sub_headers}


def _types(items: list[dict[str, Any]]) -> list[str]:
    return [str(i.get("type") or i.get("role")) for i in items]


def test_messages_turns_carry_tool_use_then_tool_result_like_claude_code() -> None:
    spec = fixture("claude_code")
    (h0, b0), (_h1, b1), (_h2, b2), _ = _bodies("messages")
    assert h0["X-Claude-Code-Session-Id"] == "t0"
    assert orjson.loads(b0["metadata"]["user_id"])["session_id"] == "t0"
    assert b0["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert b0["max_tokens"] == 3
    shape = [(m["role"], [c["type"] for c in m["content"]]) for m in spec["turns"][1]["messages"]]
    assert [(m["role"], [c["type"] for c in m["content"]]) for m in b1["messages"]] == shape
    use, result = b1["messages"][1]["content"][0], b1["messages"][2]["content"][0]
    assert result["tool_use_id"] == use["id"] and use["name"] in {t["name"] for t in b1["tools"]}
    assert b2["messages"][:2] == [
        {**m, "content": [dict(c) for c in m["content"]]} for m in b1["messages"][:2]
    ]
    assert b2["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in b2["messages"][2]["content"][-1]  # only the last block is marked
    sub = _bodies("messages", "t0:sub-1")[0][0]
    assert sub["X-Claude-Code-Agent-Id"] == "sub-1" and sub["X-Claude-Code-Parent-Agent-Id"] == "lead"


def test_responses_turns_carry_function_call_then_output_like_codex() -> None:
    spec = fixture("codex")
    (h0, b0), (_h1, b1), (_h2, b2), _ = _bodies("responses")
    assert h0["session-id"] == "t0" and b0["prompt_cache_key"] == "t0"
    assert b0["instructions"] and b0["max_output_tokens"] == 3
    assert _types(b1["input"]) == _types(spec["turns"][1]["input"])
    call, output = b1["input"][1], b1["input"][2]
    assert output["call_id"] == call["call_id"] and orjson.loads(call["arguments"])
    assert b2["input"][:3] == b1["input"]  # each turn appends to the last one's input
    assert _bodies("responses", "t0:sub-1")[0][0]["thread-id"] == "sub-1"


def test_harness_shapes_refuse_a_kv_retention_hint() -> None:
    trace = _trace()
    with pytest.raises(ValueError, match="kv-retention-hint"):
        make_client("messages", trace, PromptBuilder(trace), "m", kv_retention_hint=1.0)
    assert make_client("chat", trace, PromptBuilder(trace), "m", kv_retention_hint=1.0).name == "chat"


def _feed(reader: Any, events: list[dict[str, Any]]) -> list[bool]:
    return [reader.feed(e) for e in events]


def test_messages_reader_sums_the_prompt_and_counts_cache_reads() -> None:
    r = MessagesReader()
    start = {"input_tokens": 5, "cache_read_input_tokens": 90, "cache_creation_input_tokens": 10}
    events = [
        {"type": "message_start", "message": {"usage": {**start, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": "{"},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 7}},
    ]
    assert _feed(r, events) == [False, False, False, True, True, False, False]
    assert not r.done
    r.feed({"type": "message_stop"})
    assert r.done and r.error is None
    assert r.usage == Usage(prompt_tokens=105, cached_tokens=90, output_tokens=7)
    bad = MessagesReader()
    bad.feed({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    assert bad.error is not None and "overloaded" in bad.error
    assert read_message({"usage": {"input_tokens": 3, "output_tokens": 2}}) == Usage(3, None, 2)


def test_responses_reader_reads_usage_from_the_final_event() -> None:
    usage = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 64}, "output_tokens": 4}
    r = ResponsesReader()
    events = [
        {"type": "response.created", "response": {"status": "in_progress"}},
        {"type": "response.output_text.delta", "delta": "Hi"},
        {"type": "response.output_text.delta", "delta": ""},
        {"type": "response.completed", "response": {"status": "completed", "usage": usage}},
    ]
    assert _feed(r, events) == [False, True, False, False]
    assert r.done and r.error is None and r.usage == Usage(100, 64, 4)
    capped = ResponsesReader()
    final = {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "usage": usage}
    capped.feed({"type": "response.incomplete", "response": final})
    assert capped.done and capped.error is None  # the output limit the replay asked for
    filtered = ResponsesReader()
    filtered.feed(
        {"type": "response.incomplete", "response": {"incomplete_details": {"reason": "content_filter"}}}
    )
    assert filtered.error is not None
    failed = ResponsesReader()
    failed.feed({"type": "response.failed", "response": {"error": {"code": "server_error"}}})
    assert failed.done and failed.error is not None
    assert read_response({"usage": usage}) == Usage(100, 64, 4)


def test_chat_reader_keeps_the_completion_stream_rules() -> None:
    r = ChunkReader()
    chunk = {"choices": [{"delta": {"content": "a"}}]}
    usage = {"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 0}}
    assert _feed(r, [chunk, {"choices": [], "usage": usage}]) == [True, False]
    assert not r.done and r.end_marker(b"[DONE]") and r.done
    assert r.usage == Usage(9, 0, 2)


def test_clients_are_typed_as_their_api() -> None:
    trace = _trace()
    assert isinstance(make_client("messages", trace, PromptBuilder(trace), "m"), MessagesClient)
    assert isinstance(make_client("responses", trace, PromptBuilder(trace), "m"), ResponsesClient)


def test_chat_session_turns_carry_tool_calls_and_a_session_header_like_opencode() -> None:
    spec = fixture("opencode_openhands")
    lead = _bodies("chat-session")
    (h0, b0), (_h1, b1), (_h2, b2), _ = lead
    for headers, body in lead:
        assert {k.lower() for k in spec["headers"]} <= {k.lower() for k in headers}
        assert "vllm_xargs" not in body
    assert h0["x-session-id"] == "t0"
    assert set(spec["turns"][0]) <= set(b0) and set(spec["turns"][1]) <= set(b1)
    assert _types(b1["messages"]) == _types(spec["turns"][1]["messages"])
    call = b1["messages"][2]["tool_calls"][0]
    assert b1["messages"][3]["tool_call_id"] == call["id"]
    assert b2["messages"][:4] == b1["messages"]
    assert _bodies("chat-session", "t0:sub-1")[0][0]["x-session-id"] == "t0:sub-1"  # its own child session


def test_messages_turns_render_as_the_trace_prompt_plus_a_small_fixed_overhead() -> None:
    """The emulator's rendering of each Messages turn starts with the previous turn's tokens (the prefix
    cache sees the trace's reuse) and adds to the trace's prompt only the tools block, the role markers and
    under one KV block per tool exchange, so the KV working set matches ``--api completions``."""
    trace = _trace()
    client = make_client("messages", trace, PromptBuilder(trace), "m")
    prompts, tokenizer = PromptBuilder(trace), Tokenizer()
    previous: list[int] = []
    overheads = []
    for item in _items(trace, "t0:lead")[:3]:  # the turns that only grow
        request = anthropic.MessagesRequest.model_validate(orjson.loads(client.render(item).body))
        messages, tools = anthropic.to_chat(request)
        rendered = tokenizer.encode(render_chat(messages, tools=tools))
        assert rendered[: len(previous)] == previous
        previous = rendered
        trace_prompt = prompts.token_ids(item.task.task_id, item.request_id, item.request)
        overheads.append(len(rendered) - len(trace_prompt))
    fixed = overheads[0]
    assert 0 < fixed <= 4 * BLOCK + 16  # the tools block and the system/user markers, once
    per_exchange = [b - a for a, b in itertools.pairwise(overheads)]
    assert all(0 < d < BLOCK for d in per_exchange)
