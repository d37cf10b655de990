"""Envoy bootstraps: Envoy + the EPP (ext_proc → ORIGINAL_DST), and Envoy alone (round robin, for bench).

The EPP bootstrap: one HTTP listener whose ext_proc filter sends the request headers and the whole request
body (BUFFERED: the EPP needs the body to read Program identity and size the prompt) and the response
headers and body (STREAMED: usage, chunk by chunk) to the EPP; the router filter then sends the request to
the ``ORIGINAL_DST`` cluster, which connects to the ``host:port`` the EPP wrote in
``x-gateway-destination-endpoint``.

Timeouts follow from the scheduler's: Envoy must wait for the EPP's answer to the request body as long as
the RequestPool may hold it (``message_timeout`` = queue timeout + a margin), and the downstream stream may
stay idle that long too. ``failure_mode_allow`` is false (fail closed): with no EPP there is no endpoint to
route to (the ORIGINAL_DST cluster has no hosts of its own), so failing open could only answer 503 later,
and it would bypass the Program ledger.
"""

from __future__ import annotations

from typing import Any

from progrouter.epp.messages import DESTINATION_HEADER
from progrouter.server.edge.errors import error_body

_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_CEL_FILTER = "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter"
# The local reply of a failed ext_proc stream (its details start so), not the EPP's own refusals.
_EXT_PROC_FAILED = "response.code_details.startsWith('ext_proc_error')"
MARGIN_SECONDS = 5.0
HEALTH_INTERVAL_SECONDS = 1.0
# Envoy's default circuit breakers (1024 requests per cluster) would refuse a RequestPool's waiting crowd.
_UNLIMITED = {
    "thresholds": [{"max_connections": 1 << 30, "max_pending_requests": 1 << 30, "max_requests": 1 << 30}]
}


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _seconds(value: float) -> str:
    return f"{value:.3f}s"


def _cluster(name: str, kind: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "type": kind, "connect_timeout": "5s", "circuit_breakers": _UNLIMITED, **fields}


def _static(name: str, endpoints: list[tuple[str, int]], **fields: Any) -> dict[str, Any]:
    lb = [{"endpoint": {"address": _address(h, p)}} for h, p in endpoints]
    return _cluster(
        name, "STATIC", load_assignment={"cluster_name": name, "endpoints": [{"lb_endpoints": lb}]}, **fields
    )


def _bootstrap(
    *,
    http_filters: list[dict[str, Any]],
    clusters: list[dict[str, Any]],
    host: str,
    port: int,
    idle_seconds: float,
    route_seconds: float,
    max_request_bytes: int,
    local_reply: dict[str, Any] | None = None,
) -> dict[str, Any]:
    hcm: dict[str, Any] = {
        "@type": _HCM,
        "stat_prefix": "inference",
        "stream_idle_timeout": _seconds(idle_seconds),
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "inference",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "route": {"cluster": "workers", "timeout": _seconds(route_seconds)},
                        }
                    ],
                }
            ]
        },
        "http_filters": [
            *http_filters,
            {"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}},
        ],
    }
    if local_reply is not None:
        hcm["local_reply_config"] = local_reply
    return {
        "admin": {"address": _address("127.0.0.1", 0)},  # local only: it can stop Envoy
        "static_resources": {
            "listeners": [
                {
                    "name": "inference",
                    "address": _address(host, port),
                    "per_connection_buffer_limit_bytes": max_request_bytes,
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                            ]
                        }
                    ],
                }
            ],
            "clusters": clusters,
        },
    }


def processing_mode(response_body: str) -> dict[str, str]:
    """What Envoy sends the EPP: the request's headers and whole body always; of the response, its headers
    and then every body chunk (``stream``) or only its end, as (possibly empty) trailers (``end``)."""
    streamed = response_body == "stream"
    return {
        "request_header_mode": "SEND",
        "request_body_mode": "BUFFERED",
        "request_trailer_mode": "SKIP",
        "response_header_mode": "SEND",
        "response_body_mode": "STREAMED" if streamed else "NONE",
        "response_trailer_mode": "SKIP" if streamed else "SEND",
    }


def _epp_cluster(epps: list[tuple[str, int]]) -> dict[str, Any]:
    """The pickers, one priority level each in the order given: Envoy sends every stream to the first
    healthy one. With more than one, each is health-checked (gRPC health, every ``HEALTH_INTERVAL``) and
    ejected on its first refused connection, so the next stream already goes to the next priority."""
    http2 = {
        _HTTP_OPTIONS: {
            "@type": f"type.googleapis.com/{_HTTP_OPTIONS}",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }
    if len(epps) == 1:
        return _static("epp", epps, typed_extension_protocol_options=http2)
    levels = [
        {"priority": level, "lb_endpoints": [{"endpoint": {"address": _address(h, p)}}]}
        for level, (h, p) in enumerate(epps)
    ]
    interval = _seconds(HEALTH_INTERVAL_SECONDS)
    return _cluster(
        "epp",
        "STATIC",
        typed_extension_protocol_options=http2,
        load_assignment={
            "cluster_name": "epp",
            "endpoints": levels,
            # A dead level sends all of its share on at once (the default over-provisioning factor of
            # 1.4 would keep a partly healthy level's share; each level here is one host anyway).
            "policy": {"overprovisioning_factor": 100},
        },
        health_checks=[
            {
                "timeout": _seconds(HEALTH_INTERVAL_SECONDS),
                "interval": interval,
                "no_traffic_interval": interval,
                "unhealthy_threshold": 1,
                "healthy_threshold": 1,
                "grpc_health_check": {},
            }
        ],
        outlier_detection={
            "split_external_local_origin_errors": True,
            "consecutive_local_origin_failure": 1,
            "enforcing_consecutive_local_origin_failure": 100,
            "interval": interval,
            "base_ejection_time": interval,
            "max_ejection_percent": 100,
        },
    )


# Opening the ext_proc stream again when it could not be opened (the picker's port refused, or the stream
# was refused or reset before the picker answered anything): the next try goes to the next healthy picker.
# Nothing had reached a picker's decision yet, so a retry cannot route a request twice.
_STREAM_RETRY = {
    "retry_back_off": {"base_interval": "0.05s", "max_interval": "0.2s"},
    "num_retries": 3,
    "retry_on": "connect-failure,refused-stream,unavailable,reset",
}
NOT_ROUTED = "the endpoint picker is unavailable; the request reached no worker, retry it"
ROUTED = "the endpoint picker went away while a worker answered; the request may have been processed"


def _mapper(expression: str, message: str) -> dict[str, Any]:
    return {
        "filter": {
            "extension_filter": {
                "name": "envoy.access_loggers.extension_filters.cel",
                "typed_config": {"@type": _CEL_FILTER, "expression": expression},
            }
        },
        "body": {"inline_string": error_body(503, message).decode()},
        "body_format_override": {
            "text_format_source": {"inline_string": "%LOCAL_REPLY_BODY%"},
            "content_type": "application/json",
        },
    }


def _picker_failed() -> dict[str, Any]:
    """Envoy's own answer when the ext_proc stream failed (``status_on_error``: 503) before the response
    started, in the router's JSON error shape, saying whether the request had reached a worker: before the
    EPP answered it had not (retry it); after, the worker had it and only its answer is lost."""
    return {
        "mappers": [
            _mapper(f"{_EXT_PROC_FAILED} && !has(upstream.address)", NOT_ROUTED),
            _mapper(_EXT_PROC_FAILED, ROUTED),
        ]
    }


def epp_bootstrap(
    epp: tuple[str, int],
    *,
    queue_timeout_seconds: float,
    request_timeout_seconds: float,
    max_request_bytes: int,
    host: str = "127.0.0.1",
    port: int = 0,
    response_body: str = "stream",
    standby: list[tuple[str, int]] | None = None,
) -> dict[str, Any]:
    """Envoy on ``host:port`` (0: any free port), asking the EPP at ``epp`` where each request goes (or,
    while it is down, the first healthy of ``standby``)."""
    wait = queue_timeout_seconds + MARGIN_SECONDS
    ext_proc = {
        "@type": _EXT_PROC,
        "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}, "retry_policy": _STREAM_RETRY},
        "failure_mode_allow": False,
        # A stream that fails before the EPP answered never reached a worker: say so, retryably.
        "status_on_error": {"code": 503},
        "message_timeout": _seconds(wait),
        "processing_mode": processing_mode(response_body),
    }
    clusters = [
        _epp_cluster([epp, *(standby or [])]),
        _cluster(
            "workers",
            "ORIGINAL_DST",
            lb_policy="CLUSTER_PROVIDED",
            original_dst_lb_config={"use_http_header": True, "http_header_name": DESTINATION_HEADER},
        ),
    ]
    return _bootstrap(
        http_filters=[{"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc}],
        clusters=clusters,
        host=host,
        port=port,
        idle_seconds=wait + request_timeout_seconds,
        route_seconds=request_timeout_seconds,
        max_request_bytes=max_request_bytes,
        local_reply=_picker_failed(),
    )


def round_robin_bootstrap(
    workers: list[tuple[str, int]],
    *,
    request_timeout_seconds: float,
    max_request_bytes: int,
    host: str = "127.0.0.1",
    port: int = 0,
) -> dict[str, Any]:
    """Envoy alone: round robin over ``workers`` (the baseline of bench/epp.py)."""
    return _bootstrap(
        http_filters=[],
        clusters=[_static("workers", workers, lb_policy="ROUND_ROBIN")],
        host=host,
        port=port,
        idle_seconds=request_timeout_seconds,
        route_seconds=request_timeout_seconds,
        max_request_bytes=max_request_bytes,
    )
