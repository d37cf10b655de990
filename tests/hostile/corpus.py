"""The hand-written hostile bodies: each is refused with a 4xx and a reason, by the router or the worker.

Markers (``MARK_*``) are planted in prompt text, Program ids and header values so the log test can check that
none of them reaches a log record above DEBUG.
"""

from __future__ import annotations

import json
from typing import Any

MARK_PROMPT = "prompt-marker-5f2a"
MARK_PROGRAM = "program-marker-9c1e"
MARK_HEADER = "header-marker-77d0"


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "emu", "messages": [{"role": "user", "content": MARK_PROMPT}], "max_tokens": 2, **extra}


def _ctx(context: Any) -> bytes:
    """A chat body whose ``vllm_xargs.agentic_context`` is ``context`` (string form if a str)."""
    return json.dumps(_chat(vllm_xargs={"agentic_context": context})).encode()


def _deep_json(depth: int) -> str:
    """``depth`` nested lists as JSON text, built without recursion."""
    return "[" * depth + json.dumps(MARK_PROMPT) + "]" * depth


# path -> bodies; every one must get a 4xx JSON error.
CHAT_BODIES: dict[str, bytes] = {
    "empty body": b"",
    "malformed JSON": b'{"model": "emu", "messages": [',
    "JSON array": b"[1, 2, 3]",
    "JSON string": b'"hello"',
    "JSON number": b"42",
    "JSON null": b"null",
    "JSON true": b"true",
    "invalid UTF-8": b'{"model": "emu", "messages": [{"role": "user", "content": "\xff\xfe'
    + MARK_PROMPT.encode()
    + b'"}]}',
    "NUL byte in the JSON": b'{"model": "emu",\x00 "messages": []}',
    "trailing garbage": json.dumps(_chat()).encode() + b" garbage",
    "10,000-deep JSON": (
        '{"model": "emu", "messages": [{"role": "user", "content": ' + _deep_json(10_000) + "}]}"
    ).encode(),
    "1,000-deep content": (
        '{"model": "emu", "messages": [{"role": "user", "content": ' + _deep_json(1000) + "}]}"
    ).encode(),
    "messages is a string": json.dumps(_chat(messages=MARK_PROMPT)).encode(),
    "messages holds a number": json.dumps(_chat(messages=[1])).encode(),
    "content is a number": json.dumps(_chat(messages=[{"role": "user", "content": 5}])).encode(),
    "role is a list": json.dumps(_chat(messages=[{"role": ["user"], "content": "x"}])).encode(),
    "max_tokens is text": json.dumps(_chat(max_tokens="many")).encode(),
    "max_tokens is negative": json.dumps(_chat(max_tokens=-5)).encode(),
    "stream is a list": json.dumps(_chat(stream=[True])).encode(),
    "model is a number": json.dumps(_chat(model=5)).encode(),
    "unknown model": json.dumps(_chat(model="no-such-model")).encode(),
    "context: not JSON": _ctx("not json " + MARK_PROGRAM),
    "context: JSON array": _ctx("[1, 2]"),
    "context: a number": _ctx(5),
    "context: a list": _ctx([MARK_PROGRAM]),
    "context: program_id a float": _ctx(json.dumps({"program_id": 5.5})),
    "context: step_id negative": _ctx(json.dumps({"program_id": MARK_PROGRAM, "step_id": -1})),
    "context: blocks_parent text": _ctx({"program_id": MARK_PROGRAM, "blocks_parent": "yes"}),
    "context: parent is itself": _ctx({"program_id": MARK_PROGRAM, "parent_program_id": MARK_PROGRAM}),
    "context: 300-byte program_id": _ctx({"program_id": MARK_PROGRAM + "x" * 300}),
    "context: deadline infinite": _ctx('{"program_id": "' + MARK_PROGRAM + '", "deadline": 1e999}'),
    "vllm_xargs a list": json.dumps(_chat(vllm_xargs=[MARK_PROGRAM])).encode(),
    "context: program_id a list": _ctx({"program_id": [MARK_PROGRAM]}),
    "context: program_id an object": _ctx({"program_id": {"id": MARK_PROGRAM}}),
    "context: task_id an object": _ctx(json.dumps({"task_id": {"a": MARK_PROGRAM}, "agent_id": "a"})),
    "context: program_id empty": _ctx({"program_id": ""}),
    "context: kv_retention_ttl text": _ctx({"program_id": MARK_PROGRAM, "kv_retention_ttl": "long"}),
    "context: kv_retention_ttl negative": _ctx({"program_id": MARK_PROGRAM, "kv_retention_ttl": -1}),
    "context: kv_retention_ttl a list": _ctx(
        json.dumps({"program_id": MARK_PROGRAM, "kv_retention_ttl": [1]})
    ),
    "context: 10,000-deep string form": _ctx('{"program_id": ' + _deep_json(10_000) + "}"),
    "context: 1,000-deep object form": json.dumps(_chat())[:-1].encode()
    + b', "vllm_xargs": {"agentic_context": {"program_id": '
    + _deep_json(1000).encode()
    + b"}}}",
    "context: 1 MB string form": _ctx(json.dumps({"program_id": MARK_PROGRAM, "pad": "x" * (1 << 20)})),
}
