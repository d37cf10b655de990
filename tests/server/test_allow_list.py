"""Only inference routes reach a worker: everything else is the router's JSON 404 (tested on the emulator)."""

from __future__ import annotations

import aiohttp

from progrouter.server.proxy import PROXIED_ROUTES
from support.factories import EngineFactory, RouterFactory

WORKER_ADMIN_ROUTES = (
    "/admin/fault",
    "/sleep",
    "/wake_up",
    "/reset_prefix_cache",
    "/collective_rpc",
    "/pause",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
)  # the router's own /add_worker is answered by the router, never proxied: tests/server/test_admin.py


async def _fault_modes(client: aiohttp.ClientSession, engine_url: str) -> list[str]:
    async with client.get(engine_url + "/admin/fault") as resp:
        return [r["mode"] for r in (await resp.json())["ranks"]]


async def test_worker_admin_routes_never_reach_the_emulator(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url])
    for path in WORKER_ADMIN_ROUTES:
        async with client.post(router.url + path, json={"rank": None, "mode": "refuse"}) as resp:
            assert resp.status == 404, path
            error = (await resp.json())["error"]
            assert error["code"] == 404 and path in error["message"]
    assert set(await _fault_modes(client, engine.url)) == {"none"}  # /admin/fault did not get through
    body = {"model": engine.config.model_name, "prompt": "hello", "max_tokens": 2}
    async with client.post(router.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200  # the inference route still works
    tokenize = {"model": engine.config.model_name, "prompt": "a"}
    async with client.post(router.url + "/tokenize", json=tokenize) as resp:
        assert resp.status == 200


def test_the_allow_list_is_inference_only() -> None:
    words = ("admin", "sleep", "lora", "rpc", "worker", "pause", "reset")
    assert not {r for r in PROXIED_ROUTES if any(w in r for w in words)}
    generation = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses", "/generate"}
    assert generation <= PROXIED_ROUTES
