"""Access control: client and admin keys, open probes, and which ``Authorization`` a worker sees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from progrouter.config import ConfigError, RouterConfig
from progrouter.server.cli import config_from_args
from support.factories import EngineFactory, RouterFactory

from .conftest import PROGRAM, Recorder, json_post

BODY = b'{"model": "emu", "prompt": "hi", "max_tokens": 2}'
ADMIN_GETS = ("/scheduling/diagnostics",)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _status(client: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> int:
    async with client.request(method, url, **kw) as resp:
        if resp.status in (401, 403):
            payload = await resp.json()
            assert payload["error"]["code"] == resp.status and payload["error"]["message"]
        return resp.status


async def test_client_keys_guard_inference_and_leave_probes_open(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    engine = await make_engine()
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nkey-from-file\n\n")
    router = await make_router(
        [engine.url], PROGRAM, client_api_keys=["key-a"], client_api_keys_file=str(keys)
    )
    url = router.url + "/v1/completions"
    assert await _status(client, "POST", url, data=BODY) == 401
    assert await _status(client, "POST", url, data=BODY, headers=_bearer("key-b")) == 401
    assert await _status(client, "POST", url, data=BODY, headers={"Authorization": "Basic key-a"}) == 401
    assert await _status(client, "POST", url, data=BODY, headers=_bearer("key-a")) == 200
    assert await _status(client, "POST", url, data=BODY, headers=_bearer("key-from-file")) == 200
    assert await _status(client, "GET", router.url + "/v1/models") == 401
    for probe in ("/health", "/readiness", "/liveness"):
        assert await _status(client, "GET", router.url + probe) == 200, probe
    preflight = {"Origin": "http://app", "Access-Control-Request-Method": "POST"}
    assert await _status(client, "OPTIONS", url, headers=preflight) != 401  # browsers send no key on it
    assert await _status(client, "OPTIONS", url) == 401  # a plain OPTIONS is no preflight
    # no separate admin key: a client key opens the admin routes, nothing else does
    assert await _status(client, "GET", router.url + "/scheduling/diagnostics") == 401
    assert (
        await _status(client, "GET", router.url + "/scheduling/diagnostics", headers=_bearer("key-a")) == 200
    )


async def test_admin_key_is_separate_from_client_keys(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url], PROGRAM, client_api_keys=["key-a"], admin_api_key="adm")
    diag = router.url + "/scheduling/diagnostics"
    async with client.get(diag, headers=_bearer("adm")) as resp:
        before = await resp.json()
    context = json.dumps({"program_id": "p-anonymous"})
    program = {"model": "emu", "prompt": "hi", "max_tokens": 2, "vllm_xargs": {"agentic_context": context}}
    assert await _status(client, "POST", router.url + "/v1/completions", json=program) == 401
    async with client.get(diag, headers=_bearer("adm")) as resp:
        assert await resp.json() == before  # a refused Program request leaves no trace in the scheduler
    assert await _status(client, "GET", diag) == 401
    assert await _status(client, "GET", diag, headers=_bearer("key-a")) == 403
    assert await _status(client, "GET", diag, headers=_bearer("adm")) == 200
    for path in ("/flush_cache", "/add_worker", "/remove_worker", "/workers/x", "/dashboard"):
        assert await _status(client, "POST", router.url + path, headers=_bearer("key-a")) == 403, path
        assert await _status(client, "POST", router.url + path) == 401, path


async def test_admin_key_alone_leaves_inference_open(
    make_engine: EngineFactory, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    router = await make_router([engine.url], PROGRAM, admin_api_key="adm")
    assert await _status(client, "POST", router.url + "/v1/completions", data=BODY) == 200
    assert await _status(client, "GET", router.url + "/scheduling/diagnostics") == 401
    assert await _status(client, "GET", router.url + "/scheduling/diagnostics", headers=_bearer("adm")) == 200


async def test_open_router_never_lends_the_worker_key(
    make_recorder: Any, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker: Recorder = await make_recorder()
    router = await make_router([worker.url], api_key="worker-secret")
    await json_post(client, router.url + "/v1/completions", BODY)
    await json_post(client, router.url + "/v1/completions", BODY, headers=_bearer("client-own"))
    async with client.get(router.url + "/v1/models") as resp:
        assert resp.status == 200
    seen = [r["headers"].get("Authorization") for r in worker.requests]
    assert seen == [None, "Bearer client-own", None]  # as upstream: the client's own header, or none


async def test_authenticated_callers_reach_workers_with_the_worker_key(
    make_recorder: Any, make_router: RouterFactory, client: aiohttp.ClientSession
) -> None:
    worker: Recorder = await make_recorder()
    router = await make_router([worker.url], api_key="worker-secret", client_api_keys=["key-a"])
    reply = await json_post(client, router.url + "/v1/completions", BODY)
    assert reply.status == 401
    assert worker.requests == []
    await json_post(client, router.url + "/v1/completions", BODY, headers=_bearer("key-a"))
    assert [r["headers"].get("Authorization") for r in worker.requests] == ["Bearer worker-secret"]

    keyless = await make_router([worker.url], client_api_keys=["key-a"])
    await json_post(client, keyless.url + "/v1/completions", BODY, headers=_bearer("key-a"))
    assert worker.requests[-1]["headers"].get("Authorization") is None  # the router's key stays here


@pytest.mark.parametrize(
    "fields",
    [
        {"client_api_keys": [""]},
        {"client_api_keys": ["two words"]},
        {"admin_api_key": "tab\tkey"},
        {"client_api_keys_file": "/nonexistent/keys"},
    ],
)
def test_unusable_keys_are_a_config_error(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="key"):
        RouterConfig(worker_urls=["http://w:1"], **fields)


def test_flags(tmp_path: Path) -> None:
    import argparse

    from progrouter.server.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    keys = tmp_path / "k"
    keys.write_text("f1\n")
    args = parser.parse_args(
        ["--worker-urls", "http://w:1", "--client-api-key", "a", "--client-api-key", "b",
         "--client-api-keys-file", str(keys), "--admin-api-key", "adm",
         "--client-header-timeout-secs", "3", "--client-body-timeout-secs", "4",
         "--client-keepalive-timeout-secs", "5", "--max-client-connections", "6"]
    )  # fmt: skip
    config = config_from_args(args)
    assert config.client_api_keys == ["a", "b"] and config.client_api_keys_file == str(keys)
    assert config.admin_api_key == "adm"
    assert (config.client_header_timeout_secs, config.client_body_timeout_secs) == (3, 4)
    assert (config.client_keepalive_timeout_secs, config.max_client_connections) == (5, 6)
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(ConfigError, match="no API key"):
        config_from_args(
            parser.parse_args(["--worker-urls", "http://w:1", "--client-api-keys-file", str(empty)])
        )
