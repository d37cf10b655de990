"""Generated hostile input: hypothesis draws bodies and headers that are invalid by construction, and each one
is sent to the router (Program scheduling on, emulator behind it) over loopback.

Hypothesis draws the examples up front (derandomized, a bounded count, so the tier stays fast and
repeatable); the router then answers each: a 4xx with a JSON reason, no Program state change, still alive.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from progrouter.server.runner import RunningRouter
from support.factories import EngineFactory, RouterFactory

from .conftest import MODEL, PROGRAM, Reply, assert_alive, diagnostics, exchange, json_post
from .test_bodies import worker_or_router_error

EXAMPLES = 60

json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
not_an_identifier = (
    st.floats(allow_nan=False).filter(lambda f: not f.is_integer())
    | st.lists(json_leaf, max_size=3)
    | st.dictionaries(st.text(max_size=5), json_leaf, max_size=3)
    | st.booleans()
    | st.just("")
    | st.just("   ")
)
SESSION_HEADERS = ("x-session-id", "session-id", "x-claude-code-session-id")
IDENTITY_KEYS = ("program_id", "task_id", "session_id", "agent_id", "parent_program_id", "root_program_id")


def draw(strategy: st.SearchStrategy[Any], n: int = EXAMPLES) -> list[Any]:
    """``n`` examples of ``strategy``, the same on every run."""
    out: list[Any] = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(value: Any) -> None:
        out.append(value)

    collect()
    return out


@st.composite
def bad_context(draw_: st.DrawFn) -> bytes:
    """A chat body whose agentic_context names a Program and has one identity field of a type no identifier
    may have (without a Program id a context is no identity at all, and the request is routed natively)."""
    context = {"program_id": "generated"}
    context |= draw_(
        st.dictionaries(st.sampled_from(IDENTITY_KEYS), st.text(min_size=1, max_size=10), max_size=3)
    )
    context[draw_(st.sampled_from(IDENTITY_KEYS))] = draw_(not_an_identifier)
    form = draw_(st.sampled_from(["string", "object"]))
    value: Any = json.dumps(context) if form == "string" else context
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    return json.dumps({**body, "vllm_xargs": {"agentic_context": value}}).encode()


def _not_an_object(raw: bytes) -> bool:
    try:
        return not isinstance(orjson.loads(raw), dict)
    except orjson.JSONDecodeError:
        return True


not_json_objects = st.binary(max_size=200).filter(_not_an_object) | json_value.filter(
    lambda v: not isinstance(v, dict)
).map(lambda v: json.dumps(v).encode())
wrong_messages = json_value.filter(lambda v: not isinstance(v, list)).map(
    lambda v: json.dumps({"model": MODEL, "messages": v}).encode()
)
header_text = st.text(st.characters(codec="ascii", exclude_characters="\r\n\x00"), max_size=30)
split_header = st.tuples(header_text, st.sampled_from(["\r", "\n", "\x00", "\r\n "]), header_text).map(
    lambda t: f"X-Gen: {t[0]}{t[1]}{t[2]}\r\n".encode()
)


async def _check_each(
    client: aiohttp.ClientSession, router: RunningRouter, bodies: list[bytes], *, status: int | None = None
) -> None:
    before = await diagnostics(client, router)
    for body in bodies:
        reply = await json_post(
            client, router.url + "/v1/chat/completions", body, headers={"Content-Type": "application/json"}
        )
        assert 400 <= reply.status < 500, (body, reply)
        worker_or_router_error(reply)
        assert status is None or reply.status == status, (body, reply)
    assert await diagnostics(client, router) == before
    await assert_alive(client, router)


async def test_generated_non_objects_are_400(
    program_router: RunningRouter, client: aiohttp.ClientSession
) -> None:
    await _check_each(client, program_router, draw(not_json_objects), status=400)


async def test_generated_bad_identities_are_400(
    program_router: RunningRouter, client: aiohttp.ClientSession
) -> None:
    await _check_each(client, program_router, draw(bad_context()), status=400)


async def test_generated_wrong_message_types_are_4xx(
    program_router: RunningRouter, client: aiohttp.ClientSession
) -> None:
    await _check_each(client, program_router, draw(wrong_messages))


async def test_generated_split_headers_are_400(
    program_router: RunningRouter, client: aiohttp.ClientSession
) -> None:
    before = await diagnostics(client, program_router)
    body = b'{"model": "emu", "prompt": "x", "max_tokens": 2}'
    for header in draw(split_header):
        data = (
            b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nConnection: close\r\n" + header
            + b"Content-Length: %d\r\n\r\n" % len(body) + body
        )  # fmt: skip
        reply: Reply = await exchange(program_router.url, data)
        assert reply.status == 400, (header, reply)
        reply.error()
    assert await diagnostics(client, program_router) == before
    await assert_alive(client, program_router)


non_ascii_text = st.text(st.characters(min_codepoint=0x80, max_codepoint=0x2FFF), min_size=1, max_size=12)


async def test_generated_non_ascii_identity_headers_are_400(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    """With the auto enable key a session header names a Program; one that is not ASCII is refused."""
    engine = await make_engine()
    router = await make_router([engine.url], {**PROGRAM, "enable_key": "auto"})
    before = await diagnostics(client, router)
    body = b'{"model": "emu", "prompt": "x", "max_tokens": 2}'
    for name, value in draw(st.tuples(st.sampled_from(SESSION_HEADERS), non_ascii_text), n=30):
        data = (
            b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nConnection: close\r\n"
            + f"{name}: ".encode() + value.encode() + b"\r\n"
            + b"Content-Length: %d\r\n\r\n" % len(body) + body
        )  # fmt: skip
        reply = await exchange(router.url, data)
        assert reply.status == 400, (name, value, reply)
        assert name in reply.error()  # the identity parser's refusal names the header
    assert await diagnostics(client, router) == before
    await assert_alive(client, router)
