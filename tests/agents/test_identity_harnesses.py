"""Program identity from what each coding agent sends: the spec's header schemas on Messages and Responses
bodies, and the harness sources beyond the spec (``identity_extensions``) where the spec leaves room."""

from __future__ import annotations

import json
from typing import Any

import pytest

from progrouter.agents.identity import IdentityResult, extract_identity
from progrouter.config import EnableKey, ProgramSchedulingConfig
from progrouter.program.types import InvalidIdentity

pytestmark = pytest.mark.timeout(30)

AUTO = EnableKey.AUTO
SESSION = "0b7c1f8e-5a7d-4a8e-9d55-3c2b1a0f9e8d"
MESSAGES = {
    "model": "m",
    "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    "stream": True,
}
RESPONSES = {"model": "m", "instructions": "be brief", "input": "hi", "stream": True}


def messages_with(user_id: str) -> dict[str, Any]:
    return {**MESSAGES, "metadata": {"user_id": user_id}}


def json_user_id(session: str = SESSION) -> str:
    return json.dumps({"device_id": "d" * 64, "account_uuid": "acc-1", "session_id": session})


def legacy_user_id(session: str = SESSION) -> str:
    return f"user_{'ab' * 32}_account_7e1c2d3a-0000-4000-8000-000000000001_session_{session}"


def ext(body: dict[str, Any] | None, headers: dict[str, str] | None = None) -> IdentityResult | None:
    return extract_identity(body, headers or {}, AUTO, extensions=True)


def test_spec_headers_name_programs_on_messages_and_responses_bodies() -> None:
    claude = extract_identity(MESSAGES, {"X-Claude-Code-Session-Id": "s1"}, AUTO)
    codex = extract_identity(RESPONSES, {"session-id": "s2"}, AUTO)
    assert claude is not None and claude.identity.program_id == "s1:lead"
    assert claude.source == "header:claude_code"
    assert codex is not None and codex.identity.program_id == "s2:lead" and codex.source == "header:codex"


def test_claude_subagent_headers_make_a_child_of_its_parent_agent() -> None:
    headers = {
        "x-claude-code-session-id": "s1",
        "x-claude-code-agent-id": "agent-7",
        "x-claude-code-parent-agent-id": "agent-3",
    }
    found = extract_identity(MESSAGES, headers, AUTO)
    assert found is not None
    identity = found.identity
    assert identity.program_id == "s1:agent-7" and identity.agent_role == "subagent"
    assert identity.parent_program_id == "s1:agent-3" and identity.blocks_parent
    only_agent = extract_identity(
        MESSAGES, {"x-claude-code-session-id": "s1", "x-claude-code-agent-id": "a"}, AUTO
    )
    assert only_agent is not None and only_agent.identity.parent_program_id == "s1:lead"


@pytest.mark.parametrize("user_id", [json_user_id(), legacy_user_id()], ids=["json", "legacy"])
def test_claude_metadata_user_id_names_the_session(user_id: str) -> None:
    found = ext(messages_with(user_id))
    assert found is not None
    assert found.source == "metadata:claude_code"
    assert found.identity.program_id == f"{SESSION}:lead" and found.identity.session_id == SESSION
    assert found.identity.placement_hash_key == f"metadata.user_id:session:{SESSION}"


def test_claude_metadata_with_agent_headers_is_a_subagent() -> None:
    found = ext(messages_with(json_user_id()), {"x-claude-code-agent-id": "worker-1"})
    assert found is not None
    assert found.identity.program_id == f"{SESSION}:worker-1"
    assert found.identity.parent_program_id == f"{SESSION}:lead"


def test_metadata_is_beyond_the_spec_off_by_default_and_under_the_canonical_key() -> None:
    body = messages_with(json_user_id())
    assert extract_identity(body, {}, AUTO) is None
    assert extract_identity(body, {}, EnableKey.CANONICAL, extensions=True) is None


def test_the_specs_sources_win_over_every_extension() -> None:
    body = messages_with(json_user_id("from-metadata"))
    found = ext(body, {"x-claude-code-session-id": "from-header", "x-opencode-session": "oc"})
    assert found is not None and found.identity.session_id == "from-header"
    found = ext(body, {"x-session-id": "generic"})
    assert found is not None and found.source == "header:generic"


@pytest.mark.parametrize(
    "user_id",
    ["user-42", "{not json", json.dumps({"device_id": "d"}), json.dumps(["session_id"]), "user_x_session_"],
)
def test_a_user_id_of_another_form_is_not_an_identity(user_id: str) -> None:
    assert ext(messages_with(user_id)) is None
    assert ext({**MESSAGES, "metadata": "not an object"}) is None


def test_an_oversized_metadata_session_is_refused() -> None:
    with pytest.raises(InvalidIdentity, match="exceeds 256 bytes"):
        ext(messages_with(json_user_id("s" * 300)))


def test_opencode_and_codex_cli_headers() -> None:
    opencode = ext({"model": "m", "messages": []}, {"x-opencode-session": "ses_abc"})
    assert opencode is not None and opencode.source == "header:opencode"
    assert opencode.identity.program_id == "ses_abc:lead"
    assert opencode.identity.placement_hash_key == "header:x-opencode-session:ses_abc"
    codex = ext(RESPONSES, {"session_id": "conv-1"})
    assert (
        codex is not None
        and codex.source == "header:codex_cli"
        and codex.identity.program_id == "conv-1:lead"
    )
    review = ext(RESPONSES, {"session_id": "conv-1", "x-openai-subagent": "review"})
    assert review is not None and review.identity.program_id == "conv-1:review"
    assert review.identity.parent_program_id == "conv-1:lead" and not review.identity.expected_resume
    assert extract_identity(RESPONSES, {"session_id": "conv-1"}, AUTO) is None  # beyond the spec: off


def test_identity_extensions_needs_the_auto_key() -> None:
    with pytest.raises(ValueError, match="identity_extensions requires"):
        ProgramSchedulingConfig(identity_extensions=True)
    assert ProgramSchedulingConfig(enable_key="auto", identity_extensions=True).identity_extensions
