"""The worker-management API of upstream vllm-router, answered by the router itself (never proxied).

Shapes and status codes are the wheel's (0.1.17, observed): ``/add_worker``, ``/remove_worker`` and
``/flush_cache`` answer text/plain; ``/list_workers``, ``/get_loads`` and the ``/workers`` resource JSON.
Listings are per target, as upstream: with DP Ranks a worker appears as ``url@0``, ``url@1``…; adding and
removing take the worker's base URL and act on all its Ranks.
Adding a worker waits (up to ``worker_startup_timeout_secs``) until it answers its health endpoint, like
upstream; removing one that is absent succeeds, like upstream. Two deliberate differences: a URL that is not
http(s) is refused at once (upstream waits out the startup timeout on it), and a trailing slash is ignored.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from progrouter.routing.target import Target
from progrouter.server.edge.errors import json_response
from progrouter.server.proxy import PROXY_KEY
from progrouter.server.state import STATE_KEY, RouterState

log = logging.getLogger("progrouter.router")


class AdminError(Exception):
    """A refused admin call: ``status`` and the message upstream would give."""

    def __init__(self, status: int, message: str, code: str = "ADD_WORKER_FAILED") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _text(message: str, status: int = 200) -> web.Response:
    return web.Response(status=status, text=message, content_type="text/plain", charset="utf-8")


def _query_url(request: web.Request) -> str:
    url = request.query.get("url")
    if url is None:
        raise AdminError(400, "Failed to deserialize query string: missing field `url`")
    return url


async def add_worker(state: RouterState, url: str) -> str:
    """Wait for ``url`` to answer its health endpoint, then add it; the success message."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise AdminError(400, f"The worker url {url} does not have http or https prefix")
    if url in state.health.healthy:
        raise AdminError(400, f"Worker {url} already exists")
    checker = state.checker
    assert checker is not None, "the router is not running"
    config = state.config
    answered = await checker.wait_for_answer(
        [url], config.worker_startup_timeout_secs, config.worker_startup_check_interval
    )
    if not answered:
        raise AdminError(
            400,
            f"Timeout {config.worker_startup_timeout_secs:g}s waiting for worker {url} to become healthy. "
            "Please set --worker-startup-timeout-secs to a larger value",
        )
    if not state.add_worker(url):  # added by a concurrent call while this one waited
        raise AdminError(400, f"Worker {url} already exists")
    return f"Successfully added worker: {url}"


def remove_worker(app: web.Application, url: str) -> None:
    """Remove ``url`` (absent: nothing to do, as upstream) and forget its circuit breakers."""
    breakers = app[PROXY_KEY].breakers
    for target in app[STATE_KEY].remove_worker(url):
        breakers.forget(target.id)


async def handle_add_worker(request: web.Request) -> web.Response:
    try:
        return _text(await add_worker(request.app[STATE_KEY], _query_url(request)))
    except AdminError as exc:
        return _text(str(exc), exc.status)


async def handle_remove_worker(request: web.Request) -> web.Response:
    try:
        url = _query_url(request)
    except AdminError as exc:
        return _text(str(exc), exc.status)
    remove_worker(request.app, url)
    return _text(f"Successfully removed worker: {url}")


async def handle_list_workers(request: web.Request) -> web.Response:
    return json_response({"urls": [t.id for t in request.app[STATE_KEY].targets]})


async def _each_target(
    state: RouterState, method: str, path: str
) -> list[tuple[str, aiohttp.ClientResponse | BaseException, bytes]]:
    """Call ``path`` on every target (its Rank header set) at once: (target id, response or error, body)."""
    session = state.session
    assert session is not None
    timeout = aiohttp.ClientTimeout(total=state.config.health_check_timeout_secs)
    headers = {} if state.config.api_key is None else {"Authorization": f"Bearer {state.config.api_key}"}

    async def call(target: Target) -> tuple[aiohttp.ClientResponse | BaseException, bytes]:
        try:
            async with session.request(
                method, target.base_url + path, headers={**headers, **target.headers()}, timeout=timeout
            ) as resp:
                return resp, await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return exc, b""

    targets = list(state.targets)
    results = await asyncio.gather(*(call(t) for t in targets))
    return [(t.id, r, b) for t, (r, b) in zip(targets, results, strict=True)]


def _load_of(answer: aiohttp.ClientResponse | BaseException, body: bytes) -> int:
    """A worker's ``/get_load`` answer ``{"load": n}``; -1 when it gave none, as upstream."""
    if isinstance(answer, BaseException) or answer.status != 200:
        return -1
    try:
        load: Any = orjson.loads(body).get("load")
    except (orjson.JSONDecodeError, AttributeError):
        return -1
    return load if isinstance(load, int) else -1


async def handle_get_loads(request: web.Request) -> web.Response:
    results = await _each_target(request.app[STATE_KEY], "GET", "/get_load")
    return json_response({"workers": [{"worker": u, "load": _load_of(r, b)} for u, r, b in results]})


async def handle_flush_cache(request: web.Request) -> web.Response:
    results = await _each_target(request.app[STATE_KEY], "POST", "/flush_cache")
    failed = [u for u, r, _ in results if isinstance(r, BaseException) or not 200 <= r.status < 300]
    if failed:
        log.warning("cache flush failed on %s", ", ".join(failed))
        return _text("Cache flush failed on one or more servers", 500)
    return _text("Cache flushed on all servers")


# ----------------------------------------------------------------------------------- the /workers resource
def _worker_entry(state: RouterState, target: Target) -> dict[str, Any]:
    """One target as upstream lists it; ``load`` is the router's requests in flight to it."""
    return {
        "url": target.id,
        "model_id": "unknown",
        "worker_type": "regular",
        "is_healthy": state.health.healthy[target.base_url],
        "load": state.policy.in_flight.get(target.id, 0),
        "connection_mode": "Http",
        "priority": 50,
        "cost": 1.0,
    }


def _json_error(status: int, message: str, code: str) -> web.Response:
    return json_response({"error": message, "code": code}, status=status)


async def handle_workers(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    targets = state.targets
    return json_response(
        {
            "workers": [_worker_entry(state, t) for t in targets],
            "total": len(targets),
            "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": len(targets)},
        }
    )


async def handle_workers_post(request: web.Request) -> web.Response:
    try:
        body: Any = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        return _text(f"Failed to parse the request body as JSON: {exc}", 400)
    url = body.get("url") if isinstance(body, dict) else None
    if not isinstance(url, str):
        return _text("Failed to deserialize the JSON body into the target type: missing field `url`", 422)
    try:
        message = await add_worker(request.app[STATE_KEY], url)
    except AdminError as exc:
        return _json_error(exc.status, str(exc), exc.code)
    return json_response({"success": True, "message": message})


async def handle_worker_get(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    url = request.match_info["url"]
    target = next((t for t in state.targets if t.id == url), None)
    if target is None:
        return _json_error(404, f"Worker {url} not found", "WORKER_NOT_FOUND")
    return json_response(
        {"url": url, "model_id": "unknown", "is_healthy": state.health.healthy[target.base_url]}
    )


async def handle_worker_delete(request: web.Request) -> web.Response:
    url = request.match_info["url"]
    remove_worker(request.app, url)
    return json_response({"success": True, "message": f"Worker {url} removed successfully"})


async def _method_not_allowed(request: web.Request) -> web.Response:
    return web.Response(status=405)


ADMIN_ROUTES: dict[str, dict[str, Handler]] = {
    "/add_worker": {"POST": handle_add_worker},
    "/remove_worker": {"POST": handle_remove_worker},
    "/list_workers": {"GET": handle_list_workers},
    "/get_loads": {"GET": handle_get_loads},
    "/flush_cache": {"POST": handle_flush_cache},
    "/workers": {"GET": handle_workers, "POST": handle_workers_post},
    "/workers/{url}": {"GET": handle_worker_get, "DELETE": handle_worker_delete},
}


def add_admin_routes(app: web.Application) -> None:
    """Register the admin routes (other methods on them: 405, as upstream); before the proxy's catch-all."""
    for path, handlers in ADMIN_ROUTES.items():
        resource = app.router.add_resource(path)
        for method, handler in handlers.items():
            resource.add_route(method, handler)
        resource.add_route("*", _method_not_allowed)
