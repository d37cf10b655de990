"""``grpc.health.v1.Health/Check`` on the ext_proc listener: what Envoy's gRPC health check asks a picker.

Envoy health-checks the pickers of a pool (active and standby, see ``bootstrap``) on the port it sends
streams to, so the answer comes from the process that would decide. SERVING while the EPP runs; NOT_SERVING
once it drains (SIGTERM), so Envoy moves new streams to the standby before this one stops. The two messages
are one field each, encoded here by hand rather than pulling in another generated package.
"""

from __future__ import annotations

from typing import Any

import grpc

from progrouter.server.state import RouterState

SERVICE = "grpc.health.v1.Health"
# HealthCheckResponse{status: SERVING (1) | NOT_SERVING (2)}: field 1, varint.
SERVING = b"\x08\x01"
NOT_SERVING = b"\x08\x02"


def _identity(data: bytes) -> bytes:
    return data


def health_handler(state: RouterState) -> Any:
    """The generic handler of ``Check`` (``Watch`` is not served: Envoy only calls ``Check``)."""

    async def check(request: bytes, context: Any) -> bytes:
        return NOT_SERVING if state.draining else SERVING

    method = grpc.unary_unary_rpc_method_handler(
        check, request_deserializer=_identity, response_serializer=_identity
    )
    return grpc.method_handlers_generic_handler(SERVICE, {"Check": method})
