"""Identity extraction: every rule of upstream §3.1 and the identity list of §8.1."""

from __future__ import annotations

import json
from typing import Any

import pytest

from progrouter.agents.identity import IdentityResult, extract_identity
from progrouter.config import EnableKey
from progrouter.program.types import InvalidIdentity, RequestHints
from progrouter.routing.hash_key import UNDIGESTED_BODY_KEY

pytestmark = pytest.mark.timeout(30)

AUTO = EnableKey.AUTO
CANONICAL = EnableKey.CANONICAL


def ctx(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "vllm_xargs": {"agentic_context": fields}}


def get(
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    key: EnableKey = AUTO,
    **kw: Any,
) -> IdentityResult:
    result = extract_identity(body, headers or {}, key, **kw)
    assert result is not None
    return result


def reason(body: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> str:
    with pytest.raises(InvalidIdentity) as info:
        extract_identity(body, headers or {}, AUTO)
    assert info.value.status == 400
    assert str(info.value) == f"invalid Program identity: {info.value.reason}"
    return info.value.reason


# ------------------------------------------------------------------------------------ header contracts


def test_codex_headers_derive_worker_thread_with_lead_parent() -> None:
    r = get(headers={"session-id": "session-a", "thread-id": "worker"})
    ident = r.identity
    assert ident.program_id == "session-a:worker"
    assert ident.parent_program_id == "session-a:lead"
    assert ident.placement_hash_key == "header:session-id:session-a"
    assert ident.placement_key == "session-a"
    assert ident.task_id == ident.session_id == "session-a"
    assert ident.agent_role == "subagent"
    assert ident.blocks_parent is True
    assert ident.expected_resume is False
    assert r.source == ident.source == "header:codex"
    assert r.hints == RequestHints()


def test_claude_headers_with_explicit_parent() -> None:
    headers = {
        "X-Claude-Code-Session-Id": "session-c",
        "x-claude-code-agent-id": "researcher",
        "x-claude-code-parent-agent-id": "planner",
    }
    ident = get(headers=headers).identity
    assert ident.program_id == "session-c:researcher"
    assert ident.placement_hash_key == "header:x-claude-code-session-id:session-c"
    assert ident.placement_key == "session-c"
    assert ident.parent_program_id == "session-c:planner"
    assert ident.expected_resume is False
    assert ident.source == "header:claude_code"


def test_claude_subagent_defaults_to_lead_parent() -> None:
    headers = {"x-claude-code-session-id": "session-c", "x-claude-code-agent-id": "researcher"}
    assert get(headers=headers).identity.parent_program_id == "session-c:lead"


def test_generic_session_header_is_a_resuming_lead() -> None:
    ident = get(headers={"x-session-id": "session-d"}).identity
    assert ident.program_id == "session-d:lead"
    assert ident.placement_hash_key == "header:x-session-id:session-d"
    assert ident.agent_role == "lead"
    assert ident.parent_program_id is None
    assert ident.blocks_parent is False
    assert ident.expected_resume is True
    assert ident.source == "header:generic"


def test_header_schemas_are_never_mixed_and_claude_wins() -> None:
    headers = {
        "x-session-id": "generic",
        "session-id": "codex",
        "thread-id": "worker",
        "x-claude-code-session-id": "claude",
    }
    ident = get(headers=headers).identity
    # The Codex thread header belongs to another schema: it must not become the Claude agent.
    assert ident.program_id == "claude:lead"
    assert ident.source == "header:claude_code"


def test_header_values_are_trimmed_and_empty_is_absent() -> None:
    ident = get(headers={"x-claude-code-session-id": "   ", "session-id": "  s1  "}).identity
    assert ident.program_id == "s1:lead"
    assert ident.placement_hash_key == "header:session-id:s1"


def test_actor_prefixed_with_session_is_not_doubled() -> None:
    ident = get(headers={"session-id": "s", "thread-id": "s:worker"}).identity
    assert ident.program_id == "s:worker"
    assert ident.agent_id == "worker"


def test_header_actor_with_empty_component_is_an_error() -> None:
    message = reason(headers={"session-id": "s", "thread-id": "s:"})
    assert message == "agent_id must include an agent component"


def test_non_ascii_header_is_an_error() -> None:
    assert reason(headers={"x-session-id": "caf\u00e9"}) == "Invalid x-session-id header"


def test_request_and_trace_ids_and_session_params_never_create_identity() -> None:
    headers = {"x-request-id": "request-1", "x-trace-id": "trace-1", "x-user-id": "u"}
    assert extract_identity(None, headers, AUTO) is None
    assert extract_identity({"session_params": {"session_id": "task-a"}}, {}, AUTO) is None
    assert extract_identity({"model": "m", "messages": []}, {}, AUTO) is None


def test_enable_key_default_is_canonical_only() -> None:
    headers = {"x-claude-code-session-id": "session-a"}
    hint = {"agent_hint": {"session_id": "s", "blocks_parent": False}}
    assert extract_identity(None, headers, CANONICAL) is None
    assert extract_identity(hint, {}, CANONICAL) is None
    assert extract_identity(None, headers, AUTO) is not None
    assert extract_identity(hint, {}, "auto") is not None
    assert extract_identity(ctx(program_id="p"), {}, CANONICAL) is not None


def test_default_key_ignores_a_malformed_agent_hint() -> None:
    assert extract_identity({"agent_hint": 3}, {}, CANONICAL) is None


# ---------------------------------------------------------------------------------- canonical context


def test_canonical_beats_agent_hint_and_headers() -> None:
    body = ctx(program_id="p1", task_id=None)
    body["agent_hint"] = {"session_id": "hint", "blocks_parent": False}
    r = get(body, {"x-session-id": "s"})
    assert r.identity.program_id == "p1"
    assert r.source == "agentic_context"


def test_agent_hint_beats_headers() -> None:
    body = {"agent_hint": {"session_id": "hint", "blocks_parent": False}}
    r = get(body, {"x-session-id": "s"})
    assert r.identity.program_id == "hint"
    assert r.source == "agent_hint"


def test_explicit_program_id() -> None:
    ident = get(ctx(program_id="task-a:researcher", expected_resume=False)).identity
    assert ident.program_id == "task-a:researcher"
    assert ident.expected_resume is False
    assert ident.placement_key == "task-a:researcher"


def test_json_string_context_with_null_task() -> None:
    encoded = json.dumps({"program_id": "encoded-program", "task_id": None, "expected_resume": True})
    body = {"vllm_xargs": {"agentic_context": encoded}}
    ident = get(body, key=CANONICAL).identity
    assert ident.program_id == "encoded-program"
    assert ident.task_id is None


def test_json_string_context_bounds() -> None:
    big = json.dumps({"program_id": "p", "pad": "x" * (16 * 1024)})
    assert reason({"vllm_xargs": {"agentic_context": big}}) == (
        "vllm_xargs.agentic_context must contain a bounded JSON object"
    )
    assert reason({"vllm_xargs": {"agentic_context": "{not json"}}) == (
        "vllm_xargs.agentic_context must contain a bounded JSON object"
    )
    assert reason({"vllm_xargs": {"agentic_context": "[1, 2]"}}) == (
        "vllm_xargs.agentic_context must be an object"
    )
    assert reason({"vllm_xargs": {"agentic_context": 5}}) == "vllm_xargs.agentic_context must be an object"
    assert reason({"vllm_xargs": "x"}) == "vllm_xargs must be an object"
    exactly = json.dumps({"program_id": "p"}).ljust(16 * 1024)
    assert get({"vllm_xargs": {"agentic_context": exactly}}).identity.program_id == "p"


def test_absent_or_null_context_is_native() -> None:
    assert extract_identity({"vllm_xargs": None}, {}, CANONICAL) is None
    assert extract_identity({"vllm_xargs": {"agentic_context": None}}, {}, CANONICAL) is None
    assert extract_identity({"vllm_xargs": {"other": 1}}, {}, CANONICAL) is None


def test_context_without_program_or_task_has_no_identity() -> None:
    assert extract_identity(ctx(priority=3), {}, CANONICAL) is None


def test_derived_program_id_from_task_defaults_to_lead() -> None:
    ident = get(ctx(task_id="t")).identity
    assert ident.program_id == "t:lead"
    assert ident.agent_role == "lead"
    assert ident.parent_program_id is None
    assert ident.blocks_parent is False
    assert ident.expected_resume is True


def test_inferred_blocking_subagent_and_explicit_override() -> None:
    ident = get(ctx(task_id="task-b", agent_id="researcher")).identity
    assert ident.program_id == "task-b:researcher"
    assert ident.placement_key == "task-b"
    assert ident.agent_role == "subagent"
    assert ident.parent_program_id == "task-b:lead"
    assert ident.blocks_parent is True
    assert ident.expected_resume is False
    resumed = get(ctx(task_id="task-b", agent_id="researcher", expected_resume=True)).identity
    assert resumed.expected_resume is True
    nonblocking = get(ctx(task_id="task-b", agent_id="researcher", blocking_parent=False)).identity
    assert nonblocking.blocks_parent is False
    assert nonblocking.expected_resume is True


def test_task_scoped_agent_prefix_is_stripped() -> None:
    ident = get(ctx(task_id="t", agent_id="t:worker")).identity
    assert ident.agent_id == "worker"
    assert ident.program_id == "t:worker"
    assert reason(ctx(task_id="t", agent_id="t:")) == "agent_id must include an agent component"


def test_session_fills_task_and_header_fills_session_and_agent() -> None:
    ident = get(ctx(session_id="s", agent_id="a")).identity
    assert ident.task_id == "s"
    assert ident.program_id == "s:a"
    headers = {"x-claude-code-session-id": "hs", "x-claude-code-agent-id": "ha"}
    from_headers = get(ctx(priority=1), headers, key=CANONICAL).identity
    assert from_headers.session_id == "hs"
    assert from_headers.program_id == "hs:ha"
    assert from_headers.source == "agentic_context"


def test_explicit_program_with_task_key_present_does_not_borrow_session() -> None:
    ident = get(ctx(program_id="p", task_id=None, session_id="s")).identity
    assert ident.task_id is None
    assert ident.placement_key == "s"
    borrowed = get(ctx(program_id="p", session_id="s")).identity
    assert borrowed.task_id == "s"


def test_parent_derivation_swaps_agent_suffix_or_scopes_under_task() -> None:
    ident = get(ctx(program_id="wf:child", task_id="wf", agent_id="child", parent_agent_id="boss")).identity
    assert ident.parent_program_id == "wf:boss"
    other = get(ctx(program_id="custom", task_id="wf", agent_id="child", parent_agent_id="boss")).identity
    assert other.parent_program_id == "wf:boss"
    explicit = get(ctx(task_id="wf", agent_id="child", parent_id="elsewhere")).identity
    assert explicit.parent_program_id == "elsewhere"
    header_parent = get(
        ctx(task_id="wf", agent_id="child"),
        {"x-claude-code-session-id": "s", "x-claude-code-parent-agent-id": "wf:planner"},
    ).identity
    assert header_parent.parent_program_id == "wf:planner"


def test_parent_must_differ_and_blocking_needs_parent() -> None:
    message = reason(ctx(program_id="p", parent_program_id="p"))
    assert message == "parent_program_id must differ from program_id"
    assert reason(ctx(program_id="p", blocks_parent=True)) == "blocks_parent requires parent_program_id"


def test_full_canonical_field_set() -> None:
    body = ctx(
        program_id="workflow:child",
        task_id="workflow",
        session_id="session-a",
        agent_id="child",
        parent_agent_id="lead",
        root_program_id="workflow:root",
        blocks_parent=False,
        expected_resume=True,
        agent_role="subagent",
        spawn_reason="research",
        request_id="request-a",
        step_id=7,
        priority=9,
        deadline_seconds=12.5,
        expected_output_length=2048,
        kv_retention_ttl_seconds=4.5,
    )
    r = get(body, key=CANONICAL)
    ident = r.identity
    assert ident.parent_program_id == "workflow:lead"
    assert ident.root_program_id == "workflow:root"
    assert ident.session_id == "session-a"
    assert ident.spawn_reason == "research"
    assert ident.step_id == 7
    assert ident.agent_role == "subagent"
    assert ident.blocks_parent is False
    assert r.hints == RequestHints(
        request_id="request-a",
        priority=9,
        deadline_seconds=12.5,
        expected_output_tokens=2048,
        kv_retention_ttl_seconds=4.5,
    )


def test_aliases() -> None:
    body = ctx(
        program_id="p",
        root_id="r",
        subagent_type="explore",
        deadline=3,
        expected_output_tokens=10,
        kv_retention_ttl=0,
    )
    r = get(body)
    assert r.identity.root_program_id == "r"
    assert r.identity.spawn_reason == "explore"
    assert r.hints.deadline_seconds == 3.0
    assert r.hints.expected_output_tokens == 10
    assert r.hints.kv_retention_ttl_seconds == 0.0
    assert get(ctx(program_id="p", agent_type="t")).identity.spawn_reason == "t"
    # The first non-null alias wins.
    assert get(ctx(program_id="p", deadline=None, deadline_seconds=4)).hints.deadline_seconds == 4.0


def test_omitted_step_is_none_here() -> None:
    assert get(ctx(program_id="p")).identity.step_id is None


def test_type_rules() -> None:
    assert get(ctx(program_id=42)).identity.program_id == "42"
    assert get(ctx(program_id="  p  ")).identity.program_id == "p"
    assert reason(ctx(task_id=[], agent_id="worker")) == "task_id must be a string-compatible identifier"
    assert reason(ctx(program_id=1.5)) == "program_id must be a string-compatible identifier"
    assert reason(ctx(program_id=True)) == "program_id must be a string-compatible identifier"
    assert reason(ctx(program_id="  ")) == "program_id must not be empty"
    assert reason(ctx(program_id="p", blocks_parent="yes")) == "blocks_parent must be a boolean"
    assert reason(ctx(program_id="p", expected_resume=1)) == "expected_resume must be a boolean"
    assert reason(ctx(program_id="p", step_id=-1)) == "step_id must be a non-negative integer"
    assert reason(ctx(program_id="p", step_id=1.0)) == "step_id must be a non-negative integer"
    assert reason(ctx(program_id="p", priority="high")) == "priority must be an integer"
    assert get(ctx(program_id="p", priority=-3)).hints.priority == -3
    assert reason(ctx(program_id="p", deadline_seconds="5")) == "deadline_seconds must be seconds as a number"
    assert reason(ctx(program_id="p", kv_retention_ttl_seconds=-1)) == (
        "kv_retention_ttl_seconds must be finite and non-negative"
    )
    assert reason(ctx(program_id="p", expected_output_length=-5)) == (
        "expected_output_length must be a non-negative integer"
    )


# --------------------------------------------------------------------------------------------- agent_hint


def test_agent_hint_blocking_child() -> None:
    body = {"agent_hint": {"session_id": "child", "parent_session_id": "parent", "blocks_parent": True}}
    ident = get(body).identity
    assert ident.program_id == ident.session_id == ident.placement_key == "child"
    assert ident.task_id is None
    assert ident.parent_program_id == "parent"
    assert ident.blocks_parent is True
    assert ident.expected_resume is False


def test_agent_hint_defaults_and_errors() -> None:
    assert reason({"agent_hint": {"session_id": "root"}}) == "blocking agent_hint requires parent_session_id"
    assert reason({"agent_hint": {"session_id": "root", "blocks_parent": True}}) == (
        "blocking agent_hint requires parent_session_id"
    )
    assert reason({"agent_hint": {"blocks_parent": False}}) == "agent_hint.session_id is required"
    assert reason({"agent_hint": ["x"]}) == "agent_hint must be an object"
    root = get({"agent_hint": {"session_id": "root", "blocks_parent": False}}).identity
    assert root.expected_resume is True
    override = get({"agent_hint": {"session_id": "c", "parent_session_id": "p", "expected_resume": True}})
    assert override.identity.expected_resume is True


# --------------------------------------------------------------------------------------- placement hash


def test_placement_hash_key_falls_back_to_native_key() -> None:
    assert get(ctx(program_id="p"), {"x-user-id": "u1"}).identity.placement_hash_key == "header:x-user-id:u1"
    body = ctx(program_id="p")
    body["user"] = "alice"
    assert get(body).identity.placement_hash_key == "user:alice"
    short = {"vllm_xargs": {"agentic_context": {"program_id": "p"}}}
    raw = json.dumps(short).encode()
    assert len(raw) <= 100
    assert get(short, raw_body=raw).identity.placement_hash_key == f"request:{raw.decode()}"
    long_body = ctx(program_id="p", pad="x" * 200)
    key = get(long_body).identity.placement_hash_key
    assert key.startswith("request_hash:")
    # The hash of the same body is stable.
    assert get(long_body).identity.placement_hash_key == key
    # A binding strategy that never reads the key spares the digest, and only the digest.
    assert get(long_body, digest_body=False).identity.placement_hash_key == UNDIGESTED_BODY_KEY
    undigested_short = get(short, raw_body=raw, digest_body=False).identity
    assert undigested_short.placement_hash_key == f"request:{raw.decode()}"


def test_placement_hash_key_prefers_framework_session_header_even_for_canonical() -> None:
    headers = {"session-id": " codex ", "x-user-id": "u"}
    assert get(ctx(program_id="p"), headers, key=CANONICAL).identity.placement_hash_key == (
        "header:session-id:codex"
    )


def test_placement_hash_key_is_bounded_at_512_bytes() -> None:
    assert reason(ctx(program_id="p"), {"x-user-id": "u" * 600}) == "placement hash key exceeds 512 bytes"


# ------------------------------------------------------------------------------------------------- bounds


@pytest.mark.parametrize(
    "field",
    [
        "task_id",
        "session_id",
        "agent_id",
        "parent_program_id",
        "root_program_id",
        "agent_role",
        "spawn_reason",
        "request_id",
    ],
)
def test_every_persisted_string_is_bounded(field: str) -> None:
    fields: dict[str, Any] = {"program_id": "program", "task_id": None, "blocks_parent": False}
    fields[field] = "x" * 257
    with pytest.raises(InvalidIdentity, match="exceeds 256 bytes"):
        extract_identity(ctx(**fields), {}, AUTO)


def test_bounds_count_utf8_bytes() -> None:
    ok = ctx(program_id="program", task_id=None, spawn_reason="x" * 256)
    assert get(ok).identity.spawn_reason == "x" * 256
    multibyte = ctx(program_id="program", task_id=None, spawn_reason="é" * 129)
    assert reason(multibyte) == "spawn_reason exceeds 256 bytes"
    assert get(ctx(program_id="é" * 128)).identity.program_id == "é" * 128
    assert reason(ctx(program_id="é" * 129)) == "program_id exceeds 256 bytes"


def test_bounds_cover_headers_hint_parents_derived_ids_and_model_pool() -> None:
    assert reason(headers={"x-session-id": "x" * 257}) == "program_id exceeds 256 bytes"
    hint = {"agent_hint": {"session_id": "child", "parent_session_id": "x" * 257, "blocks_parent": True}}
    assert reason(hint) == "parent_program_id exceeds 256 bytes"
    assert reason(ctx(task_id="x" * 254, agent_id="worker")) == "program_id exceeds 256 bytes"
    with pytest.raises(InvalidIdentity, match="model pool exceeds 256 bytes"):
        extract_identity(ctx(program_id="p"), {}, AUTO, model_pool="m" * 257)


_SAME_EITHER_WAY = [
    {"task_id": "t", "agent_id": "lead"},
    {"task_id": "t", "agent_id": "t:worker", "spawn_reason": "search", "step_id": 3, "priority": -2},
    {"program_id": "p", "task_id": None, "request_id": "r", "deadline": 1.5, "kv_retention_ttl": 0},
    {"session_id": "s"},  # the task borrows the session
    {"agent_id": "helper"},  # no task: the framework session (when sent) scopes it
    {"task_id": "t", "agent_id": "a", "parent_agent_id": "lead", "blocks_parent": False},
    {"task_id": "t", "agent_id": "a", "parent_program_id": "t:a"},  # invalid: its own parent
    {"program_id": "p", "blocks_parent": True},  # invalid: blocking without a parent
    {"task_id": "t", "agent_id": "t:"},  # invalid: empty agent component
    {"task_id": "t", "step_id": -1},  # invalid after the hash key
    {"task_id": "t", "priority": True, "expected_output_tokens": "many"},  # invalid after the hash key
]

_CLAUDE = {"x-claude-code-session-id": "cs", "x-claude-code-agent-id": "cs:b"}


@pytest.mark.parametrize("fields", _SAME_EITHER_WAY)
@pytest.mark.parametrize("headers", [{}, _CLAUDE])
def test_a_context_string_derives_what_its_object_does_every_time(
    fields: dict[str, Any], headers: dict[str, str]
) -> None:
    """A context string's derivation is remembered: the first, the remembered and the object's agree,
    errors included (and a long model pool's error still comes before a late field's)."""

    def outcome(context: Any, pool: str) -> object:
        body = {"model": "m", "vllm_xargs": {"agentic_context": context}}
        try:
            return extract_identity(body, headers, AUTO, raw_body=b"{}", model_pool=pool)
        except InvalidIdentity as exc:
            return exc.reason

    text = json.dumps(fields)
    for pool in ("program:all", "p" * 300):
        expected = outcome(fields, pool)
        assert outcome(text, pool) == expected
        assert outcome(text, pool) == expected  # remembered


def test_the_hash_key_is_checked_before_the_fields_read_after_it() -> None:
    for context in ({"task_id": "t", "step_id": -1}, json.dumps({"task_id": "t", "step_id": -1})):
        body = {"model": "m", "vllm_xargs": {"agentic_context": context}}
        with pytest.raises(InvalidIdentity) as info:
            extract_identity(body, {}, AUTO, raw_body=b"{}", model_pool="p" * 300)
        assert info.value.reason == "model pool exceeds 256 bytes"
        with pytest.raises(InvalidIdentity) as info:
            extract_identity(body, {}, AUTO, raw_body=b"{}", model_pool="program:all")
        assert info.value.reason == "step_id must be a non-negative integer"
