"""`progrouter top` against a live router, rendered to a non-interactive console."""

from __future__ import annotations

import argparse
import io
import re

import aiohttp
import pytest
from rich.console import Console

from integration.helpers import CAPACITY, program_body, words
from progrouter.top import add_arguments, watch
from support.factories import EngineFactory, RouterFactory

pytestmark = pytest.mark.timeout(60)


def top_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


async def test_top_renders_ranks_programs_and_events(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engines = [await make_engine(), await make_engine()]
    router = await make_router([e.url for e in engines], {"token_capacity_per_dp_rank": CAPACITY})
    for i in range(3):
        body = program_body(f"p{i}", words("a", 150), kv_retention_ttl_seconds=60)
        async with client.post(router.url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200
    diagnostics = await (await client.get(router.url + "/scheduling/diagnostics")).json()
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False, color_system=None)
    assert await watch(top_args("--url", router.url, "--iterations", "2"), console) == 0
    text = out.getvalue()
    assert "3 Programs: 3 running, 0 retained, 0 pooled" in text
    for r in diagnostics["ranks"]:
        assert r["target_id"] in text
        for p in r["programs"]:
            assert p["program"] in text
    assert "program_admit" in text and not re.search(r"\bp[012]\b", text)  # redacted ids only


async def test_top_says_when_the_router_refuses(
    make_engine: EngineFactory, make_router: RouterFactory
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url], {"token_capacity_per_dp_rank": CAPACITY}, admin_api_key="k")
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=False, color_system=None)
    assert await watch(top_args("--url", router.url, "--iterations", "1"), console) == 1
    assert "401" in out.getvalue()
    assert await watch(top_args("--url", router.url, "--iterations", "1", "--api-key", "k"), console) == 0
