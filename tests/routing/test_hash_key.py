import zlib

import pytest

from progrouter.routing.hash_key import UNDIGESTED_BODY_KEY, native_hash_key


def test_header_priority_and_case_insensitivity() -> None:
    headers = {"X-Request-Id": "req-1", "X-Session-ID": "sess-1"}
    assert native_hash_key(headers, {"user": "bob"}, b"{}") == "header:x-session-id:sess-1"
    assert native_hash_key({"x-trace-id": "t"}, None, b"") == "header:x-trace-id:t"


def test_empty_header_is_skipped() -> None:
    assert native_hash_key({"x-session-id": "", "x-user-id": "u1"}, None, b"") == "header:x-user-id:u1"


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ({"session_params": {"session_id": "nested"}, "session_id": "direct", "user": "u"}, "session:nested"),
        ({"user": "alice", "session_id": "s"}, "user:alice"),
        ({"session_id": "legacy", "user_id": "x"}, "session:legacy"),
        ({"user_id": 456}, "user:456"),
        ({"session_params": "not-an-object", "user": "bob"}, "user:bob"),
    ],
)
def test_body_fields_in_priority_order(body: dict[str, object], key: str) -> None:
    assert native_hash_key({"x-other": "1"}, body, b"ignored") == key


def test_non_identifier_body_values_fall_through() -> None:
    assert native_hash_key({}, {"user": True, "session_id": ""}, b"short") == "request:short"


def test_body_fallback_short_and_long() -> None:
    assert native_hash_key({}, {"prompt": "hi"}, b'{"prompt":"hi"}') == 'request:{"prompt":"hi"}'
    raw = b"x" * 101
    assert native_hash_key({}, None, raw) == f"request_hash:{zlib.crc32(raw):08x}"
    assert native_hash_key({}, None, b"y" * 100) == "request:" + "y" * 100


def test_a_long_body_is_digested_only_when_asked() -> None:
    raw = b"x" * 101
    assert native_hash_key({}, None, raw, digest=False) == UNDIGESTED_BODY_KEY
    # Every other key is the same either way: only the digest is left out.
    assert native_hash_key({}, None, b"y" * 100, digest=False) == "request:" + "y" * 100
    assert native_hash_key({"x-session-id": "s"}, None, raw, digest=False) == "header:x-session-id:s"
    assert native_hash_key({}, {"user": "u"}, raw, digest=False) == "user:u"
