"""A worker removed and re-added at runtime (``POST /remove_worker?url=…`` / ``POST /add_worker?url=…``).

Removing a worker fails its Programs over (nothing stays charged to its Ranks); adding it back makes its
Ranks available again. Requests in flight on the removed worker still end with an answer or an error.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from integration.helpers import wait_until
from support.agents import Tally
from support.tapped_engine import read_arrivals

from .conftest import RigFactory
from .harness import Rig, check_invariants, drive, mixed_agents

pytestmark = pytest.mark.timeout(90)


async def _admin(rig: Rig, path: str, url: str) -> int:
    async with rig.session.post(rig.url + path, params={"url": url}) as r:
        await r.read()
        return r.status


async def test_worker_removed_and_re_added_at_runtime(
    make_rig: RigFactory, report: Callable[[Tally], None]
) -> None:
    rig, _ = await make_rig()
    worker = rig.engines[0]

    async def ranks() -> set[str]:
        return {r["base_url"] for r in (await rig.diagnostics())["ranks"]}

    async def fault(_: Tally) -> None:
        async def seen() -> int:
            return len(read_arrivals(worker.tap_log))

        await wait_until(seen, lambda n: n >= 3, timeout=15.0)
        assert await _admin(rig, "/remove_worker", worker.url) == 200
        await wait_until(ranks, lambda r: worker.url not in r, timeout=5.0)
        before = len(read_arrivals(worker.tap_log))
        assert await _admin(rig, "/add_worker", worker.url) == 200
        await wait_until(ranks, lambda r: worker.url in r, timeout=5.0)
        await wait_until(seen, lambda n: n > before, timeout=15.0)  # it serves again

    tally, watch = await drive(rig, mixed_agents(turns=12), fault, report)
    await check_invariants(rig, tally, watch)
