"""The ext_proc messages the EPP reads and writes, built from Envoy's generated protos (``xds-protos``).

Only what the EPP needs: header maps in, and out a CONTINUE, a header mutation that names the endpoint (and
the DP Rank), or an immediate response (the EPP's own refusal, e.g. a RequestPool timeout's 429).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.type.v3 import http_status_pb2
from multidict import CIMultiDict

from progrouter.epp.metrics import PHASES
from progrouter.server.edge.errors import error_body

# The header an ORIGINAL_DST cluster routes by (the Gateway API Inference Extension's name).
DESTINATION_HEADER = "x-gateway-destination-endpoint"
RANK_HEADER = "x-data-parallel-rank"

ProcessingRequest = ext_proc.ProcessingRequest
ProcessingResponse = ext_proc.ProcessingResponse
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def header_map(headers: Any) -> CIMultiDict[str]:
    """An ext_proc ``HeaderMap`` as a case-insensitive mapping (Envoy sends ``raw_value`` bytes)."""
    out: CIMultiDict[str] = CIMultiDict()
    for h in headers.headers:
        out.add(h.key, _value(h))
    return out


def _value(header: Any) -> str:
    """A ``HeaderValue``'s value: Envoy sends ``raw_value`` bytes (``value`` in older versions)."""
    value: str = header.raw_value.decode("utf-8", "replace") if header.raw_value else header.value
    return value


def status_and_type(headers: Any) -> tuple[int, str]:
    """A response ``HeaderMap``'s ``:status`` (0 when absent or not a number) and ``content-type``, in one
    pass and no mapping built: all the EPP reads of a response's head."""
    status, content_type = 0, ""
    for h in headers.headers:
        key = h.key.lower()
        if key == ":status" or key == "content-type":
            value = _value(h)
            if key == "content-type":
                content_type = content_type or value
            elif not status:
                status = int(value) if value.isascii() and value.isdigit() else 0
    return status, content_type


def _set(headers: Mapping[str, str]) -> list[Any]:
    return [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=k, raw_value=v.encode()), append_action=_OVERWRITE
        )
        for k, v in headers.items()
    ]


def _common(set_headers: Mapping[str, str], remove: Iterable[str]) -> Any:
    mutation = ext_proc.HeaderMutation(set_headers=_set(set_headers), remove_headers=list(remove))
    return ext_proc.CommonResponse(header_mutation=mutation)


def _continue(phase: str) -> Any:
    common = ext_proc.CommonResponse()
    if phase.endswith("_body"):
        return ProcessingResponse(**{phase: ext_proc.BodyResponse(response=common)})
    if phase.endswith("_headers"):
        return ProcessingResponse(**{phase: ext_proc.HeadersResponse(response=common)})
    return ProcessingResponse(**{phase: ext_proc.TrailersResponse()})


# Built once per phase: an answer is only serialized, never changed, so every stream can send the same one.
_CONTINUE = {phase: _continue(phase) for phase in PHASES}


def proceed(phase: str) -> Any:
    """CONTINUE for the message of ``phase`` (``request_headers``, ``response_body``, …)."""
    answer = _CONTINUE.get(phase)
    return answer if answer is not None else _continue(phase)


def route_to(phase: str, endpoint: str, dp_rank: int | None) -> Any:
    """Answer the request's last message with the chosen endpoint; a client's own Rank header is dropped
    unless the target has a Rank (then it is overwritten)."""
    chosen = {DESTINATION_HEADER: endpoint}
    if dp_rank is not None:
        chosen[RANK_HEADER] = str(dp_rank)
    common = _common(chosen, () if dp_rank is not None else (RANK_HEADER,))
    if phase == "request_body":
        return ProcessingResponse(request_body=ext_proc.BodyResponse(response=common))
    return ProcessingResponse(request_headers=ext_proc.HeadersResponse(response=common))


def refuse(status: int, message: str, details: str) -> Any:
    """The EPP's own answer to the client, in the router's JSON error shape; a 429 says when to retry."""
    headers = {"content-type": "application/json"}
    if status == 429:
        headers["retry-after"] = "1"
    immediate = ext_proc.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status),
        headers=ext_proc.HeaderMutation(set_headers=_set(headers)),
        body=error_body(status, message),
        details=details,
    )
    return ProcessingResponse(immediate_response=immediate)
