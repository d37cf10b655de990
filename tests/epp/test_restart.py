"""The EPP restarts: Envoy fails closed while it is gone, and the next requests rebuild their Programs."""

from __future__ import annotations

import aiohttp
import pytest

from integration.helpers import program_body, programs, words
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
