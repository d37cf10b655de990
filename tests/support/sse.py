"""Reading named server-sent events (the Messages and Responses APIs' streams) from an aiohttp response."""

from __future__ import annotations

import json
from typing import Any

import aiohttp


async def read_named_events(resp: aiohttp.ClientResponse) -> list[tuple[str, dict[str, Any]]]:
    """Every ``event: NAME`` / ``data: JSON`` pair of the stream, in order."""
    events: list[tuple[str, dict[str, Any]]] = []
    name: str | None = None
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            assert name is not None, f"data without an event name: {line!r}"
            events.append((name, json.loads(line[5:].strip())))
            name = None
    return events


def collapsed_names(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The event names in order, each run of one name (the deltas) collapsed to one entry."""
    names: list[str] = []
    for name, _ in events:
        if not names or names[-1] != name:
            names.append(name)
    return names
