"""routing_text walks any depth a client sends without recursion (linear: each value is visited once)."""

from __future__ import annotations

from typing import Any

from progrouter.routing.request_text import routing_text


def _nest(depth: int, wrap: str) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = [value, f"s{i}"] if wrap == "list" else {"content": value, "text": f"s{i}"}
    return value


def test_100k_levels_of_lists_and_parts() -> None:
    for wrap in ("list", "part"):
        text = routing_text({"messages": [{"role": "user", "content": _nest(100_000, wrap)}]})
        lines = text.split("\n")
        assert len(lines) == 100_002  # role, the leaf, and one string per level
        assert lines[0] == "user" and "leaf" in lines


def test_order_is_reading_order() -> None:
    body = {
        "system": [{"text": "sys"}],
        "messages": [{"role": "user", "content": ["a", {"content": ["b", {"text": "c"}]}, "d"]}],
    }
    assert routing_text(body) == "sys\nuser\na\nb\nc\nd"
