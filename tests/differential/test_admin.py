"""Worker management at runtime (admin API) and a router started with no workers: as the wheel does it."""

from __future__ import annotations

import json

import aiohttp

from support.scripted_worker import LOAD

from .conftest import Launcher, WorkerFactory, flags
from .helpers import get, post


async def test_add_remove_and_list_workers(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    a, b, c = await workers(3)
    router = await launch(kind, flags([a.url, b.url]))

    async def listed_urls() -> list[str]:
        """The wheel lists workers in hash-map order: compare as sets (sorted)."""
        return sorted(json.loads((await get(http, router.url + "/list_workers")).text)["urls"])

    listed = await get(http, router.url + "/list_workers")
    assert (listed.status, await listed_urls()) == (200, sorted([a.url, b.url]))

    added = await get(http, router.url + "/add_worker", "POST", params={"url": c.url})
    assert (added.status, added.text) == (200, f"Successfully added worker: {c.url}")
    again = await get(http, router.url + "/add_worker", "POST", params={"url": c.url})
    assert again.status == 400
    assert (await get(http, router.url + "/add_worker", "POST")).status == 400  # no url
    assert await listed_urls() == sorted([a.url, b.url, c.url])
    for _ in range(6):
        assert (await post(http, router.url)).status == 200
    assert [len(w.proxied) for w in (a, b, c)] == [2, 2, 2]

    removed = await get(http, router.url + "/remove_worker", "POST", params={"url": a.url})
    assert (removed.status, removed.text) == (200, f"Successfully removed worker: {a.url}")
    assert await listed_urls() == sorted([b.url, c.url])
    for _ in range(4):
        assert (await post(http, router.url)).status == 200
    assert [len(w.proxied) for w in (a, b, c)] == [2, 4, 4]
    # Admin routes are the router's own: none of them reached a worker.
    assert not [s.path for w in (a, b, c) for s in w.proxied if s.path != "/v1/completions"]


async def test_admin_read_routes_have_the_wheels_shapes(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    a, b = await workers(2)
    router = await launch(kind, flags([a.url, b.url]))
    loads = await get(http, router.url + "/get_loads")
    assert loads.status == 200
    # Each worker's own GET /get_load ({"load": n}); -1 when a worker has none (vLLM has none).
    assert sorted((w["worker"], w["load"]) for w in json.loads(loads.text)["workers"]) == sorted(
        [(a.url, LOAD), (b.url, LOAD)]
    )
    listing = json.loads((await get(http, router.url + "/workers")).text)
    assert listing["total"] == 2
    assert listing["stats"]["regular_count"] == 2
    assert sorted((w["url"], w["worker_type"], w["is_healthy"]) for w in listing["workers"]) == sorted(
        [(a.url, "regular", True), (b.url, "regular", True)]
    )
    flushed = await get(http, router.url + "/flush_cache", "POST")
    assert flushed.status == 200
    readiness = await get(http, router.url + "/readiness")
    assert (readiness.status, json.loads(readiness.text)["status"]) == (200, "ready")
    # /flush_cache is passed on to every worker (POST /flush_cache), once.
    assert [[(s.method, s.path) for s in w.proxied] for w in (a, b)] == [[("POST", "/flush_cache")]] * 2


async def test_no_workers_at_start_then_one_added(
    kind: str, workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession
) -> None:
    (worker,) = await workers(1)
    router = await launch(kind, flags([]), ready_path="/liveness")
    readiness = await get(http, router.url + "/readiness")
    assert readiness.status == 503
    assert (await post(http, router.url)).status == 503
    assert json.loads((await get(http, router.url + "/list_workers")).text) == {"urls": []}
    added = await get(http, router.url + "/add_worker", "POST", params={"url": worker.url})
    assert added.status == 200
    assert (await get(http, router.url + "/readiness")).status == 200
    assert (await post(http, router.url)).status == 200
    assert len(worker.proxied) == 1
