"""``epp_response_body``: what of a response Envoy shows the EPP. ``stream`` sends every body chunk (usage
read as serve reads it); ``end`` sends the response headers and then only its end, as trailers, so a
response costs the EPP two messages however long it streams. Either way each request completes in the
scheduler exactly once, and a stream cut mid-response completes it as failed."""

from __future__ import annotations

import aiohttp
import pytest

from integration.helpers import MODEL, program_body, programs, words
from integration.test_program_scheduling import CHAT, PREFIX, rank
from support.factories import EngineFactory

from .conftest import Shell, StackFactory, program_config
from .test_program_scenarios import diagnostics, post, settled

pytestmark = pytest.mark.timeout(90)
MESSAGES = "progrouter_epp_messages_total"
FEEDBACK = PREFIX + "token_estimate_feedback_total"
POOL = {"model_pool": f"program:model:{MODEL}", "endpoint": CHAT}


def _messages(shell: Shell, phase: str) -> float:
    return shell.registry.get_sample_value(MESSAGES, {"phase": phase}) or 0.0


@pytest.mark.parametrize("mode", ["stream", "end"])
async def test_each_request_completes_once_in_either_mode(
    mode: str, make_engine: EngineFactory, make_stack: StackFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    shell = Shell.of_stack(await make_stack([engine.url], program_config(), epp_response_body=mode))
    history = words("m", 200)
    for turn in range(3):
        history += " " + words("t", 20, 200 + 20 * turn)
        status, _ = await post(
            client, shell.url, program_body("prog-j", history, kv_retention_ttl_seconds=60)
        )
        assert status == 200
    status, usage = await post(client, shell.url, program_body("prog-s", history, stream=True, max_tokens=40))
    assert status == 200 and usage is not None  # the client gets the whole stream in both modes

    d = await settled(client, shell)
    by_id = {p["program"]: p for p in programs(d)}
    assert sum(p["completed_requests"] for p in by_id.values()) == 4  # each completion exactly once
    assert rank(d)["router_in_flight_requests"] == 0
    assert _messages(shell, "request_headers") == 4
    assert _messages(shell, "request_body") == 4
    assert _messages(shell, "response_headers") == 4
    observed = shell.registry.get_sample_value(FEEDBACK, {**POOL, "outcome": "observed"}) or 0.0
    if mode == "stream":
        assert _messages(shell, "response_body") > 4  # the SSE answer's chunks, one message each
        assert _messages(shell, "response_trailers") == 0
        assert observed == 4
    else:
        assert _messages(shell, "response_body") == 0
        assert _messages(shell, "response_trailers") == 0  # the engine sends none: the close is the end
        assert observed == 0  # no usage: the scheduler kept its own estimates


async def test_a_stream_cut_mid_response_completes_once_without_the_body(
    make_engine: EngineFactory, make_stack: StackFactory, client: aiohttp.ClientSession
) -> None:
    """In ``end`` the EPP cannot tell a 2xx stream cut mid-answer from one that ended: it completes it
    once, when the HTTP stream ends, as the success its status said (docs/epp.md says what that costs)."""
    engine = await make_engine(time_scale=1.0)  # slow enough decode that the stream is still running
    shell = Shell.of_stack(await make_stack([engine.url], program_config(), epp_response_body="end"))
    body = program_body("prog-c", words("c", 200), stream=True, max_tokens=2000)
    async with aiohttp.ClientSession() as leaving, leaving.post(shell.url + CHAT, json=body) as response:
        assert response.status == 200
        await response.content.readline()  # the stream has started
        engine.server.set_fault(0, "stall")  # and now it cannot end on its own
        assert rank(await diagnostics(client, shell))["router_in_flight_requests"] == 1  # not yet ended
    d = await settled(client, shell)
    [program] = programs(d)
    assert program["completed_requests"] == 1  # once, at the cut
    assert program["in_flight_requests"] == 0
    assert rank(d)["router_ledger_tokens"] == 0 or program["state"] == "active"


async def test_counter_usage_reports_what_vllms_counters_say(
    make_engine: EngineFactory, make_stack: StackFactory, client: aiohttp.ClientSession
) -> None:
    """``end`` with ``epp_counter_usage``: once the worker's counters have grown, each completion reports
    usage estimated from them (so the token estimator calibrates), still with no response body."""
    engine = await make_engine()
    shell = Shell.of_stack(
        await make_stack(
            [engine.url],
            program_config(metrics_interval_seconds=0.05),
            epp_response_body="end",
            epp_counter_usage=True,
        )
    )
    observed = 0.0
    for turn in range(200):  # bounded: the reads run every 50 ms, a turn takes a few ms
        status, _ = await post(client, shell.url, program_body("prog-k", words("k", 100 + turn)))
        assert status == 200
        await settled(client, shell)
        observed = shell.registry.get_sample_value(FEEDBACK, {**POOL, "outcome": "observed"}) or 0.0
        if observed >= 3:
            break
    assert observed >= 3
    assert _messages(shell, "response_body") == 0
    d = await diagnostics(client, shell)
    [estimate] = [e["tokens_per_byte"] for e in d["token_estimation"] if e["endpoint"] == CHAT]
    assert estimate != 0.25  # calibrated from the counters' prompt tokens per byte
    assert rank(d)["rolling"]["avg_completion_tokens"] > 0
