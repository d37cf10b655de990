"""Requests and small waits the differential scenarios share."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp

COMPLETION = {"model": "scripted", "prompt": "hello", "max_tokens": 1}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # names lower-cased
    text: str


async def post(
    http: aiohttp.ClientSession,
    url: str,
    path: str = "/v1/completions",
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    async with http.post(url + path, json=COMPLETION if body is None else body, headers=headers) as resp:
        text = await resp.text()
        return Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()}, text)


async def get(http: aiohttp.ClientSession, url: str, method: str = "GET", **kwargs: Any) -> Answer:
    async with http.request(method, url, **kwargs) as resp:
        text = await resp.text()
        return Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()}, text)


async def within(work: Coroutine[Any, Any, None], deadline_s: float, what: str) -> None:
    """Await ``work`` (a polling loop); fail, naming ``what``, if it has not finished after ``deadline_s``."""
    try:
        await asyncio.wait_for(work, deadline_s)
    except TimeoutError:
        raise AssertionError(f"timed out after {deadline_s}s waiting for {what}") from None


async def wait_for(condition: Callable[[], bool], deadline_s: float, what: str) -> None:
    """Poll ``condition`` every 10 ms until it holds."""

    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    await within(poll(), deadline_s, what)


def families(scrape: str) -> dict[str, tuple[str, frozenset[str]]]:
    """Prometheus text → {family: (type, label names)} for the families that have samples (the wheel shows a
    family only once it has one; prometheus_client also lists empty labelled families). Histogram and summary
    suffixes fold into the family; a counter's family is named with ``_total`` either way (the wheel's TYPE
    line has it, prometheus_client's does not).
    """
    types = {
        name if kind != "counter" or name.endswith("_total") else name + "_total": kind
        for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", scrape, re.MULTILINE)
    }
    labels: dict[str, set[str]] = {}
    for line in scrape.splitlines():
        if not line or line.startswith("#"):
            continue
        sample = re.match(r"[^{\s]+", line)
        assert sample, line
        name = sample.group(0)
        family = next((f for f in (name, *_unsuffixed(name)) if f in types), None)
        if family is not None:
            names = (k for k in re.findall(r'(\w+)="', line) if k not in ("le", "quantile"))
            labels.setdefault(family, set()).update(names)
    return {name: (types[name], frozenset(found)) for name, found in labels.items()}


def _unsuffixed(name: str) -> list[str]:
    return [name.removesuffix(s) for s in ("_bucket", "_sum", "_count", "_created") if name.endswith(s)]
