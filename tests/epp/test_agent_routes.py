"""Claude Code's token count through both shells of the Program scheduler (``serve``, and Envoy + ``epp``):
proxied to the emulator and never scheduled, while the same headers on ``/v1/messages`` name a Program."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from integration.helpers import MODEL
from support.factories import EngineFactory

from .conftest import ShellFactory, program_config

pytestmark = pytest.mark.timeout(90)

HEADERS = {"x-claude-code-session-id": "cc-epp", "anthropic-version": "2023-06-01"}
BODY: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}]}


async def programs(client: aiohttp.ClientSession, admin_url: str) -> int:
    async with client.get(admin_url + "/scheduling/diagnostics") as response:
        assert response.status == 200
        count: int = (await response.json())["programs"]
        return count


async def test_count_tokens_is_never_a_program_request_in_either_shell(
    make_engine: EngineFactory, make_shell: ShellFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine(model_name=MODEL)
    shell = await make_shell([engine.url], program_config(enable_key="auto"))
    # an oversized session would be refused as an identity: a token count never reads it
    for headers in (HEADERS, {**HEADERS, "x-claude-code-session-id": "s" * 300}):
        async with client.post(shell.url + "/v1/messages/count_tokens", json=BODY, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["input_tokens"] > 0
    assert await programs(client, shell.admin_url) == 0
    async with client.post(
        shell.url + "/v1/messages", json={**BODY, "max_tokens": 4}, headers=HEADERS
    ) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
    assert await programs(client, shell.admin_url) == 1
