"""How a log line looks: text, or one JSON object per line (``--log-format json``), each with its request id.

JSON lines carry ``time``, ``level``, ``logger``, ``event``, ``request_id``, ``message`` and, for scheduling
events, their fields: ``program`` (the redacted Program id hash), ``target`` (the Rank) and durations
(``*_seconds``). Raw Program ids appear only in DEBUG events, as in text logs.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import Any

import orjson

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per record; ``event`` is the scheduling event's name, else ``log``."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None)
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, "event", None) or "log",
            "request_id": getattr(record, "request_id", "-"),
            "message": record.getMessage(),
        }
        if isinstance(fields, dict):
            line.update({str(k): _jsonable(v) for k, v in fields.items() if k not in line})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``--log-format`` (its handlers need a ``RequestIdFilter``)."""
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
