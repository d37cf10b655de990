"""The Program scenarios, once per shell (``make_shell``: ``serve``, and Envoy + ``epp``): pooling, usage
(JSON and SSE), a client that leaves while pooled, the TTL hint, a malformed identity, failover; then what
only the Envoy shell has: a client leaving mid-stream through Envoy, the EPP's own 429, DP Ranks, Envoy's
route timeout."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from integration.helpers import CAPACITY, MODEL, program_body, programs, read_sse_usage, wait_until, words
from integration.test_program_scheduling import CHAT, PREFIX, rank
from support.factories import EngineFactory

from .conftest import Shell, ShellFactory, Stack, StackFactory, program_config

pytestmark = pytest.mark.timeout(90)


async def diagnostics(client: aiohttp.ClientSession, shell: Shell | Stack) -> dict[str, Any]:
    async with client.get(shell.admin_url + "/scheduling/diagnostics") as response:
        assert response.status == 200
        data: dict[str, Any] = await response.json()
        return data


async def settled(client: aiohttp.ClientSession, shell: Shell | Stack) -> dict[str, Any]:
    """Diagnostics once the Rank has no request in flight (the router finishes a request after its client)."""
    d: dict[str, Any] = await wait_until(
        lambda: diagnostics(client, shell), lambda d: rank(d)["router_in_flight_requests"] == 0
    )
    return d


async def post(
    client: aiohttp.ClientSession, url: str, body: dict[str, Any], path: str = CHAT
) -> tuple[int, Any]:
    async with client.post(url + path, json=body) as response:
        if body.get("stream"):
            return response.status, await read_sse_usage(response)
        return response.status, await response.json()


# ------------------------------------------------------------------------------------------- both shells
async def test_third_program_waits_in_the_pool_until_one_pauses(
    make_engine: EngineFactory, make_shell: ShellFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    # The stalled engine queues every request; the waiting gate would then block all admission, and this
    # test is about token capacity.
    shell = await make_shell([engine.url], program_config(admission_waiting_request_threshold=0))
    engine.server.set_fault(0, "stall")

    def send(program: str, letter: str) -> asyncio.Task[tuple[int, Any]]:
        # ~1010 estimated tokens + 100 decode buffer each: two fit in 3000, three do not.
        return asyncio.create_task(post(client, shell.url, program_body(program, words(letter, 1000))))

    first, second = send("prog-a", "a"), send("prog-b", "b")
    await wait_until(
        lambda: diagnostics(client, shell), lambda d: rank(d).get("router_active_reasoning_programs") == 2
    )
    third = send("prog-c", "c")
    d = await wait_until(lambda: diagnostics(client, shell), lambda d: d["retained_requests"] == 1)
    r = rank(d)
    assert r["router_active_programs"] == 2
    assert r["router_paused_reasoning_programs"] == 1
    assert 2000 < r["router_estimated_used_tokens"] <= CAPACITY
    assert not third.done()
    await asyncio.sleep(0.05)  # so the pooled request's wait is at least 50 ms by construction

    engine.server.set_fault(0, "none")
    results = await asyncio.wait_for(asyncio.gather(first, second, third), 30)
    assert [status for status, _ in results] == [200, 200, 200]
    assert all(body["usage"]["prompt_tokens"] > 1000 for _, body in results)
    # Without a TTL hint (and with an immature window) each finished Program paused at once.
    d = await wait_until(lambda: diagnostics(client, shell), lambda d: rank(d)["router_active_programs"] == 0)
    assert d["retained_requests"] == 0
    assert [p["state"] for p in rank(d)["programs"]] == ["paused"] * 3
    assert rank(d)["router_estimated_used_tokens"] == 0
    assert rank(d)["router_in_flight_requests"] == 0
    target = rank(d)["target_id"]
    waited = shell.registry.get_sample_value(PREFIX + "queue_wait_seconds_count", {"target": target})
    assert waited == 3

    def quantile(q: str) -> float | None:
        labels = {"target": target, "quantile": q}
        return shell.registry.get_sample_value(PREFIX + "queue_wait_seconds", labels)

    # the pooled one waited for a pause (the summary's maximum); the first two went straight through
    assert (quantile("0.5") or 0.0) <= 0.05 < (quantile("1") or 0.0)


async def test_json_and_sse_usage_reach_the_scheduler_once(
    make_engine: EngineFactory, make_shell: ShellFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    shell = await make_shell([engine.url], program_config())
    status, body = await post(client, shell.url, program_body("prog-json", words("j", 400)))
    assert status == 200
    assert body["usage"]["prompt_tokens"] > 400
    completion = {
        "model": MODEL,
        "prompt": words("s", 300),
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
        "vllm_xargs": {"agentic_context": '{"program_id": "prog-sse"}'},
    }
    status, usage = await post(client, shell.url, completion, "/v1/completions")
    assert status == 200
    assert usage is not None and usage["prompt_tokens"] == 300
    status, usage = await post(
        client, shell.url, program_body("prog-quiet", words("q", 100), stream=True, include_usage=False)
    )
    assert status == 200
    assert usage is None

    d = await diagnostics(client, shell)
    estimation = {e["endpoint"]: e["tokens_per_byte"] for e in d["token_estimation"]}
    # Both the JSON and the streamed usage moved their endpoint's coefficient away from the 0.25 default.
    assert set(estimation) == {CHAT, "/v1/completions"}
    assert all(value != 0.25 for value in estimation.values())
    rolling = rank(d)["rolling"]
    assert rolling["request_samples"] >= 2
    assert rolling["avg_prompt_tokens"] > 0
    feedback = PREFIX + "token_estimate_feedback_total"
    pool = {"model_pool": f"program:model:{MODEL}"}
    # One observation per request: the JSON body and the SSE stream each reported their usage exactly once.
    assert shell.registry.get_sample_value(feedback, {**pool, "endpoint": CHAT, "outcome": "observed"}) == 1
    assert shell.registry.get_sample_value(feedback, {**pool, "endpoint": CHAT, "outcome": "missing"}) == 1
    sse = {**pool, "endpoint": "/v1/completions", "outcome": "observed"}
    assert shell.registry.get_sample_value(feedback, sse) == 1
    d = await settled(client, shell)
    assert rank(d)["router_ledger_tokens"] == 0


async def test_client_disconnect_while_pooled_leaks_nothing(
    make_engine: EngineFactory, make_shell: ShellFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    shell = await make_shell([engine.url], program_config(admission_waiting_request_threshold=0))
    engine.server.set_fault(0, "stall")
    holders = [
        asyncio.create_task(post(client, shell.url, program_body(f"prog-{x}", words(x, 1000)))) for x in "ab"
    ]
    await wait_until(
        lambda: diagnostics(client, shell), lambda d: rank(d).get("router_active_reasoning_programs") == 2
    )
    async with aiohttp.ClientSession() as impatient:
        pooled = asyncio.create_task(post(impatient, shell.url, program_body("prog-c", words("c", 1000))))
        await wait_until(lambda: diagnostics(client, shell), lambda d: d["retained_requests"] == 1)
        pooled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pooled
    # The retained request is withdrawn and its unstarted Program released (behind Envoy: Envoy resets the
    # ext_proc stream and the EPP withdraws it).
    d = await wait_until(lambda: diagnostics(client, shell), lambda d: d["retained_requests"] == 0)
    assert d["programs"] == 2
    assert rank(d)["router_paused_reasoning_programs"] == 0

    engine.server.set_fault(0, "none")
    assert [status for status, _ in await asyncio.gather(*holders)] == [200, 200]
    d = await wait_until(lambda: diagnostics(client, shell), lambda d: rank(d)["router_active_programs"] == 0)
    r = rank(d)
    assert r["router_estimated_used_tokens"] == 0
    assert r["router_ledger_tokens"] == 0
    assert r["router_in_flight_requests"] == 0
    assert d["retained_requests"] == 0


async def test_malformed_identity_is_a_400_and_creates_nothing(
    make_engine: EngineFactory, make_shell: ShellFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    shell = await make_shell([engine.url], program_config())
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "vllm_xargs": {"agentic_context": "{bad"},
    }
    status, answer = await post(client, shell.url, body)
    assert status == 400
    message = "invalid Program identity: vllm_xargs.agentic_context must contain a bounded JSON object"
    assert answer["error"]["message"] == message
    assert engine.server.cores[0].stats.prompt_tokens == 0  # never reached the worker
    d = await diagnostics(client, shell)
    assert d["programs"] == 0
    assert d["retained_requests"] == 0


async def test_progress_ttl_keeps_a_program_warm_across_a_short_gap_not_a_long_one(
    make_engine: EngineFactory, make_shell: ShellFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    shell = await make_shell([engine.url], program_config())
    history = words("a", 1200)
    status, first = await post(
        client, shell.url, program_body("prog-a", history, kv_retention_ttl_seconds=30)
    )
    assert status == 200
    d = await diagnostics(client, shell)
    (program,) = rank(d)["programs"]
    assert (program["state"], program["status"]) == ("active", "acting")
    assert program["ttl_remaining_seconds"] > 0

    # Short gap: the Program is still Active, its next request dispatches on its placement, KV still warm.
    history += " " + words("a", 100, 1200)
    status, second = await post(
        client, shell.url, program_body("prog-a", history, kv_retention_ttl_seconds=0.3)
    )
    assert status == 200
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 0.9 * first["usage"]["prompt_tokens"]

    # Long gap: the 0.3 s TTL expires and the Program pauses, releasing its capacity.
    d = await wait_until(
        lambda: diagnostics(client, shell), lambda d: rank(d)["programs"][0]["state"] == "paused"
    )
    assert rank(d)["programs"][0]["pause_reason"] == "ttl_expired"
    assert rank(d)["router_estimated_used_tokens"] == 0
    target = rank(d)["target_id"]
    expired = shell.registry.get_sample_value(
        PREFIX + "transitions_total", {"target": target, "reason": "ttl_expired"}
    )
    assert expired == 1

    # Another Program now takes the Rank's KV; the paused Program's prefix is evicted.
    status, _ = await post(client, shell.url, program_body("prog-b", words("b", 2800)))
    assert status == 200
    history += " " + words("a", 20, 1300)
    status, third = await post(client, shell.url, program_body("prog-a", history))
    assert status == 200
    usage = third["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] < 0.25 * usage["prompt_tokens"]


async def test_killing_an_engine_fails_its_programs_over(
    make_engine: EngineFactory, make_shell: ShellFactory, client: aiohttp.ClientSession
) -> None:
    engines = [await make_engine(), await make_engine()]
    shell = await make_shell(
        [e.url for e in engines],
        program_config(),
        health_check_interval_secs=0.1,
        health_check_timeout_secs=1.0,
        health_failure_threshold=1,
    )
    # A long retention hint keeps the Program Active on its Rank after the first turn.
    body = program_body("prog-f", words("f", 300), kv_retention_ttl_seconds=600)
    status, first = await post(client, shell.url, body)
    assert status == 200, first
    [program] = programs(await diagnostics(client, shell))
    home = program["last_target"]
    assert program["state"] == "active"
    dead = next(e for e in engines if e.url == home)
    survivor = next(e for e in engines if e.url != home)

    await dead.stop()
    d = await wait_until(
        lambda: diagnostics(client, shell),
        lambda d: [r["target_id"] for r in d["ranks"]] == [survivor.url],
    )
    [program] = programs(d)
    assert program["last_target"] == survivor.url
    assert program["state"] == "paused"  # its placement died with the engine: it must be admitted again
    assert d["ranks"][0]["router_estimated_used_tokens"] == 0  # nothing charged for the dead placement
    failovers = shell.registry.get_sample_value(
        PREFIX + "transitions_total", {"target": home, "reason": "health_failover"}
    )
    assert failovers == 1

    served_before = survivor.server.cores[0].stats.prompt_tokens
    second = program_body("prog-f", words("f", 300) + " " + words("g", 50))
    status, reply = await post(client, shell.url, second)
    assert status == 200, reply
    assert survivor.server.cores[0].stats.prompt_tokens - served_before == reply["usage"]["prompt_tokens"]
    [program] = programs(await diagnostics(client, shell))
    assert program["generation"] == 0 and program["last_target"] == survivor.url
    assert len(program["program"]) == 16 and program["program"] != "prog-f"  # the id shown is redacted


# ------------------------------------------------------------------------------------------- Envoy + EPP only
async def test_client_disconnect_mid_stream_completes_the_request_as_failed(
    make_engine: EngineFactory, make_stack: StackFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine(time_scale=1.0)  # slow enough decode that the stream is still running
    shell = Shell.of_stack(await make_stack([engine.url], program_config()))
    body = program_body("prog-s", words("s", 200), stream=True, max_tokens=2000)
    async with aiohttp.ClientSession() as leaving, leaving.post(shell.url + CHAT, json=body) as response:
        assert response.status == 200
        await response.content.readline()  # the stream has started
        engine.server.set_fault(0, "stall")  # and now it cannot end on its own
        d = await diagnostics(client, shell)
        assert rank(d)["router_in_flight_requests"] == 1
    d = await settled(client, shell)
    assert rank(d)["router_estimated_used_tokens"] == 0


async def test_queue_timeout_is_an_immediate_429(
    make_engine: EngineFactory, make_stack: StackFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    shell = Shell.of_stack(await make_stack([engine.url], program_config(max_active_programs_per_target=1)))
    # A Program kept Active by its retention hint holds the Rank's only slot, so "prog-a" waits.
    status, _ = await post(
        client, shell.url, program_body("prog-z", words("z", 50), kv_retention_ttl_seconds=600)
    )
    assert status == 200
    waiting = asyncio.create_task(post(client, shell.url, program_body("prog-a", words("a", 50))))
    await wait_until(lambda: diagnostics(client, shell), lambda d: d["retained_requests"] == 1)
    # A later request of it with a short deadline times out in the RequestPool: the EPP answers 429 itself.
    late = program_body("prog-a", words("a", 60), deadline_seconds=0.3)
    async with client.post(shell.url + CHAT, json=late) as response:
        assert response.status == 429
        assert response.headers["Retry-After"] == "1"
        answer = await response.json()
    assert answer["error"]["message"] == "Program request exceeded its admission queue timeout"
    assert answer["error"]["type"] == "rate_limit_error"
    d = await diagnostics(client, shell)
    assert d["retained_requests"] == 1  # the first request of prog-a still waits; the late one is gone
    decisions = "progrouter_epp_decisions_total"
    assert shell.registry.get_sample_value(decisions, {"decision": "refused_429"}) == 1
    assert shell.registry.get_sample_value(decisions, {"decision": "program"}) == 1  # prog-z
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await wait_until(lambda: diagnostics(client, shell), lambda d: d["retained_requests"] == 0)


async def test_a_program_on_a_dp_rank_gets_the_rank_header(
    make_engine: EngineFactory, make_stack: StackFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine(data_parallel_size=2)
    shell = Shell.of_stack(await make_stack([engine.url], program_config(), intra_node_data_parallel_size=2))
    expected = {0: 0, 1: 0}  # prompt tokens each Rank should have served
    for n in range(8):
        before = {r["dp_rank"]: len(r["programs"]) for r in (await diagnostics(client, shell))["ranks"]}
        status, reply = await post(client, shell.url, program_body(f"prog-{n}", words("r", 100 + n)))
        assert status == 200, reply
        after = {r["dp_rank"]: len(r["programs"]) for r in (await diagnostics(client, shell))["ranks"]}
        [placed] = [dp for dp in after if after[dp] > before.get(dp, 0)]
        expected[placed] += reply["usage"]["prompt_tokens"]
    # Each Rank's engine core served exactly the Programs the EPP placed on it (X-data-parallel-rank).
    assert {dp: engine.server.cores[dp].stats.prompt_tokens for dp in expected} == expected
    assert all(expected.values())


async def test_envoys_route_timeout_completes_the_request_as_failed(
    make_engine: EngineFactory, make_stack: StackFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    # The bootstrap's route timeout is --request-timeout-secs: Envoy gives up on a stalled worker after 1 s.
    shell = Shell.of_stack(await make_stack([engine.url], program_config(), request_timeout_secs=1.0))
    engine.server.set_fault(0, "stall")
    async with client.post(shell.url + CHAT, json=program_body("prog-t", words("t", 100))) as response:
        assert response.status == 504
    d = await settled(client, shell)
    assert rank(d)["router_estimated_used_tokens"] == 0
    engine.server.set_fault(0, "none")
