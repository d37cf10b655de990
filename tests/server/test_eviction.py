"""The router's periodic prefix-tree eviction (``--eviction-interval-secs``) trims cache_aware's tree."""

from __future__ import annotations

import asyncio

import aiohttp

from support.factories import RouterFactory

from .conftest import WorkerFactory


async def test_periodic_eviction_trims_each_worker_to_max_tree_size(
    make_worker: WorkerFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker = await make_worker()
    router = await make_router(
        [worker.url], policy="cache_aware", max_tree_size=1_000, eviction_interval_secs=0.05
    )
    index = router.state.cache_index
    assert index is not None
    for i in range(3):  # 3 × 600 chars: under the 2 000-char hard cap, over the bound
        async with client.post(router.url + "/v1/completions", json={"prompt": f"{i}" * 600}) as resp:
            assert resp.status == 200
    deadline = asyncio.get_running_loop().time() + 10
    while index.size(worker.url) > 1_000:
        assert asyncio.get_running_loop().time() < deadline, index.size(worker.url)
        await asyncio.sleep(0.02)
    assert index.match("2" * 600) == {worker.url: 600}  # the most recent prompt survived
