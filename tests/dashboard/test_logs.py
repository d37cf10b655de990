"""``--log-format json``: one JSON object per line, the request id on lines logged for a request."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import aiohttp
import pytest

from dashboard.conftest import ProgramTurn
from progrouter.config import RouterConfig
from progrouter.server.telemetry.setup import setup_telemetry

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """The root logger as ``setup_telemetry`` sets it up for ``--log-format json``, into a buffer."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    setup_telemetry(RouterConfig(worker_urls=["http://127.0.0.1:1"], log_format="json", log_level="debug"))
    buffer = io.StringIO()
    (handler,) = root.handlers
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(buffer)
    yield buffer
    root.handlers[:], root.level = saved  # type: ignore[assignment]


async def test_json_lines_carry_request_ids_and_redacted_programs(
    json_log: io.StringIO, program_turn: ProgramTurn, client: aiohttp.ClientSession
) -> None:
    _, router = await program_turn("secret-program", "rid-123", kv_retention_ttl_seconds=0.1)
    async with client.post(
        router.url + "/v1/chat/completions", data=b"{", headers={"X-Request-Id": "rid-bad"}
    ):
        pass
    lines = [json.loads(line) for line in json_log.getvalue().splitlines()]
    assert lines and all({"time", "level", "event", "request_id", "message"} <= set(line) for line in lines)
    admits = [line for line in lines if line["event"] == "program_admit"]
    assert admits and all(len(a["program"]) == 16 and a["target"] for a in admits)
    assert not [line for line in lines if line["level"] != "debug" and "secret-program" in json.dumps(line)]
    assert any(line["request_id"] == "rid-123" for line in lines), lines
