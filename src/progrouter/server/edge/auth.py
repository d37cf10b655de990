"""Access control at the client edge: who may call which route, and what ``Authorization`` a worker sees.

Three classes of route:

- **open**: ``/health``, ``/readiness``, ``/liveness`` — probes never need a key — and CORS preflights;
- **admin**: worker management, cache flushing, diagnostics, the dashboard — the admin key when one is set,
  else any client key;
- **client**: everything else — a client key when any is set.

With no key configured the router is open, as upstream is. Keys are bearer tokens compared in constant time
(``hmac.compare_digest`` of SHA-256 digests against every key, so the time taken says neither which key came
close nor how long one is).

The worker key (``api_key``) is never lent to a caller the router has not authenticated. On an open router a
proxied request carries the client's own ``Authorization`` unchanged (upstream does the same, and sends its
``--api-key`` only on its own calls). On a router with client keys the client's header is the router's
credential, so it is replaced by ``Bearer <api_key>``, or removed when no worker key is set.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from multidict import CIMultiDict

from progrouter.config import RouterConfig, read_keys_file
from progrouter.server.edge.errors import json_error
from progrouter.server.edge.exchange import Inbound

OPEN_PATHS = frozenset({"/health", "/readiness", "/liveness"})
ADMIN_PATHS = frozenset(
    {
        "/add_worker",
        "/remove_worker",
        "/list_workers",
        "/flush_cache",
        "/get_loads",
        "/scheduling/diagnostics",
        "/workers",
        "/dashboard",
    }
)

_ADMIN_PREFIXES = tuple(p + "/" for p in sorted(ADMIN_PATHS))


class Access(Enum):
    OPEN = "open"
    CLIENT = "client"
    ADMIN = "admin"


def route_access(method: str, path: str, headers: Mapping[str, str]) -> Access:
    """The class of a request; a sub-path of an admin route (``/workers/{url}``) is admin too.

    A CORS preflight (``OPTIONS`` with ``Access-Control-Request-Method``) is open: browsers never send
    credentials on it, and it is answered by the router, never proxied.
    """
    if path in OPEN_PATHS or (method == "OPTIONS" and "Access-Control-Request-Method" in headers):
        return Access.OPEN
    if path in ADMIN_PATHS or path.startswith(_ADMIN_PREFIXES):
        return Access.ADMIN
    return Access.CLIENT


def _digest(key: str) -> bytes:
    """Keys are compared as SHA-256 digests: equal lengths, so the comparison time says nothing of a key's."""
    return hashlib.sha256(key.encode()).digest()


def _matches(token: bytes, keys: tuple[bytes, ...]) -> bool:
    found = False
    for key in keys:  # every key, always: which one matched (or came close) does not show in the time taken
        found |= hmac.compare_digest(token, key)
    return found


def _bearer(header: str | None) -> bytes | None:
    """The digest of the bearer token in ``header`` (None when there is no bearer token)."""
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return _digest(token.strip())


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    """The keys the edge checks, built once from the config."""

    client_keys: tuple[bytes, ...]  # SHA-256 digests
    admin_keys: tuple[bytes, ...]
    worker_authorization: str | None

    @classmethod
    def from_config(cls, config: RouterConfig) -> AccessPolicy:
        keys = list(config.client_api_keys)
        if config.client_api_keys_file is not None:
            keys += read_keys_file(config.client_api_keys_file)
        client = tuple(dict.fromkeys(_digest(k) for k in keys))
        admin = (_digest(config.admin_api_key),) if config.admin_api_key is not None else client
        worker = None if config.api_key is None else f"Bearer {config.api_key}"
        return cls(client, admin, worker)

    @property
    def authenticates(self) -> bool:
        return bool(self.client_keys)

    def refusal(self, access: Access, authorization: str | None) -> web.Response | None:
        """The 401/403 for a caller who may not use a route of class ``access`` (None: let it through)."""
        keys = {Access.OPEN: (), Access.CLIENT: self.client_keys, Access.ADMIN: self.admin_keys}[access]
        if not keys:
            return None
        token = _bearer(authorization)
        if token is None:
            return _unauthorized("this route needs an API key: send Authorization: Bearer <key>")
        if _matches(token, keys):
            return None
        if access is Access.ADMIN and _matches(token, self.client_keys):
            return json_error(403, "this route needs the admin API key")
        return _unauthorized("the API key is not valid")


def _unauthorized(message: str) -> web.Response:
    response = json_error(401, message)
    response.headers["WWW-Authenticate"] = 'Bearer realm="progrouter"'
    return response


def screen(policy: AccessPolicy, request: Inbound) -> CIMultiDict[str] | web.Response | None:
    """The refusal of the caller; or the headers a worker should see (a new ``Authorization``); or None when
    the request goes on as it came."""
    if not policy.authenticates and not policy.admin_keys:
        return None  # an open router: every route open, the client's own Authorization goes on
    access = route_access(request.method, request.path, request.headers)
    refused = policy.refusal(access, request.headers.get("Authorization"))
    if refused is not None:
        if request.body_exists:  # unread: end the connection rather than drain what it may still send
            refused.force_close()
        return refused
    if policy.authenticates and access is not Access.OPEN:
        headers = CIMultiDict(request.headers)
        headers.popall("Authorization", None)
        if policy.worker_authorization is not None:
            headers["Authorization"] = policy.worker_authorization
        return headers
    return None


def screened(request: web.Request, outcome: CIMultiDict[str] | None) -> web.Request:
    """An aiohttp request as ``screen`` left it."""
    return request if outcome is None else request.clone(headers=outcome)


def access_control(policy: AccessPolicy) -> Middleware:
    """``screen`` as a middleware (the Prometheus listener's; the router's edge calls it directly)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        outcome = screen(policy, request)
        if isinstance(outcome, web.Response):
            return outcome
        return await handler(screened(request, outcome))

    return middleware
