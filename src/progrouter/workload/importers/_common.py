"""Helpers the importers share."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from progrouter.workload.trace import TraceError, TraceTask


def shared_across_tasks(tasks: Iterable[TraceTask]) -> frozenset[int]:
    """Block ids that occur in more than one task: their content is global (block ids are task-scoped)."""
    seen: Counter[int] = Counter()
    for task in tasks:
        ids: set[int] = set()
        for p in task.programs:
            for r in p.requests:
                ids.update(r.hash_ids)
        seen.update(ids)
    return frozenset(i for i, n in seen.items() if n > 1)


def number(obj: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    v = obj.get(key, default)
    if v is None or isinstance(v, bool) or not isinstance(v, int | float):
        raise TraceError(f"{where}: {key!r} must be a number")
    return float(v)


def integer(obj: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = obj.get(key, default)
    if v is None or isinstance(v, bool) or not isinstance(v, int):
        raise TraceError(f"{where}: {key!r} must be an integer")
    return v


def int_list(obj: dict[str, Any], key: str, where: str) -> tuple[int, ...]:
    v = obj.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise TraceError(f"{where}: {key!r} must be a list of integers")
    return tuple(v)


def timestamp(value: Any, where: str) -> float:
    """Seconds since the epoch from an ISO-8601 string or a number."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError as exc:
            raise TraceError(f"{where}: bad timestamp {value!r}") from exc
    raise TraceError(f"{where}: missing timestamp")


def jsonl_objects(paths: Sequence[Path]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each non-blank line of each JSONL file as an object, with its ``path:line`` for error messages."""
    for path in paths:
        for n, line in enumerate(Path(path).read_bytes().splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise TraceError(f"{where}: malformed JSON ({exc})") from exc
            if not isinstance(obj, dict):
                raise TraceError(f"{where}: expected an object")
            yield where, obj
