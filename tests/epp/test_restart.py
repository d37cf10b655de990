"""The EPP restarts: Envoy fails closed while it is gone, and the next requests rebuild their Programs."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from integration.helpers import program_body, programs, wait_until, words
from integration.test_program_scheduling import rank
from progrouter.epp.bootstrap import NOT_ROUTED, ROUTED
from progrouter.epp.service import start_epp
from support.factories import EngineFactory

from .conftest import StackFactory, program_config
from .test_program_scenarios import diagnostics, post

pytestmark = pytest.mark.timeout(90)


async def test_a_restarted_epp_rebuilds_programs_from_the_next_requests(
    make_engine: EngineFactory, make_stack: StackFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    stack = await make_stack([engine.url], program_config())
    history = words("r", 300)
    status, _ = await post(client, stack.url, program_body("prog-r", history, kv_retention_ttl_seconds=600))
    assert status == 200
    config = stack.epp.state.config
    port = int(stack.epp.grpc_address.rsplit(":", 1)[1])
    await stack.epp.stop()

    served = engine.server.cores[0].stats.prompt_tokens
    async with client.post(stack.url + "/v1/chat/completions", json=program_body("prog-r", history)) as gone:
        assert gone.status == 503  # fail closed: no EPP, no endpoint, nothing reaches the worker
        assert (await gone.json())["error"]["message"] == NOT_ROUTED
    assert engine.server.cores[0].stats.prompt_tokens == served

    stack.epp = await start_epp(config.model_copy(update={"port": port}), admin_port=0)
    assert (await diagnostics(client, stack))["programs"] == 0  # a new EPP knows no Program
    status, reply = await post(
        client, stack.url, program_body("prog-r", history + " again", kv_retention_ttl_seconds=600)
    )
    assert status == 200, reply
    [program] = programs(await diagnostics(client, stack))
    assert program["state"] == "active"
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the worker still had its KV


async def test_an_epp_gone_while_a_worker_answers_is_a_503_that_says_so(
    make_engine: EngineFactory, make_stack: StackFactory, client: aiohttp.ClientSession
) -> None:
    """Fail closed covers the response too: the routed request's answer is lost, and Envoy's 503 says the
    worker had it (unlike the 503 of a request the EPP never answered, which reached no worker)."""
    engine = await make_engine()
    stack = await make_stack([engine.url], program_config())
    engine.server.set_fault(0, "stall")  # the worker holds the request and sends nothing yet
    sent = asyncio.create_task(
        client.post(stack.url + "/v1/chat/completions", json=program_body("prog-g", words("g", 50)))
    )
    await wait_until(
        lambda: diagnostics(client, stack), lambda d: rank(d).get("router_in_flight_requests") == 1
    )
    await stack.epp.stop(grace=0)  # its streams end at once, as when the process dies
    async with await sent as response:
        assert response.status == 503
        assert (await response.json())["error"]["message"] == ROUTED
