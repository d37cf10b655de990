"""Each agent harness's API shape through Envoy + ``progrouter epp`` (enable key ``auto``) in front of two
Ranks (one emulator with two DP Ranks; for Responses, two emulators of one Rank each, see
``harness.two_ranks``): Claude Code (Messages, with a subagent), Codex (Responses, with a worker thread) and
OpenCode/OpenHands (chat completions, a child session) — multi-turn sessions with tool calls become the
Programs their headers name, each stays on one Rank, later turns hit the cache, and the usage the scheduler
records from each SSE dialect is exactly what the client read. The same scenario as the ``serve`` shell's
(tests/integration/test_harness_*.py)."""

from __future__ import annotations

import aiohttp
import pytest

from integration import harness
from progrouter.workload.apis import ApiName
from support.factories import EngineFactory

from .conftest import StackFactory

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("api", ["messages", "responses", "chat-session"])
async def test_harness_sessions_through_envoy_become_programs_on_one_rank_with_cache_hits(
    api: ApiName, make_engine: EngineFactory, make_stack: StackFactory, client: aiohttp.ClientSession
) -> None:
    urls, dp = await harness.two_ranks(make_engine, api)
    stack = await make_stack(urls, harness.program_config(), intra_node_data_parallel_size=dp)
    fleet = harness.Fleet(stack.url, stack.admin_url)
    await harness.sessions_become_programs_on_one_rank_with_cache_hits(api, fleet, client)
