"""Polling vLLM ``/metrics`` for the Ranks Program scheduling tracks (spec §4.1).

One ``GET {base_url}/metrics`` per distinct worker URL (all DP Ranks of a worker share it), concurrently, with
a 2 s timeout and the router's bearer key when one is configured. A failed scrape is logged and skipped, never
raised: the scheduler then ages the Rank's last observation out and falls back to its own ledger.

Logging differs from upstream on purpose: upstream logs the WARN line on every failed interval; we log it once
when a worker starts failing (or its error changes), repeats at DEBUG, and one INFO line when it answers
again, so a dead worker does not write a warning per second.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

import aiohttp

from progrouter.observe.capacity_hint import CapacityHint
from progrouter.observe.vllm_metrics import kv_capacities, observations_for_targets, parse_vllm_metrics
from progrouter.program import BackendObservation
from progrouter.routing.target import Target

log = logging.getLogger("progrouter.observe")

SCRAPE_TIMEOUT_SECONDS = 2.0
FAILED_MESSAGE = "Program scheduling backend observation failed"
RECOVERED_MESSAGE = "Program scheduling backend observation recovered"

E = TypeVar("E")


class MetricsScraper:
    """Scrapes the workers behind a set of Ranks and maps the answers to those Ranks."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        api_key: str | None = None,
        timeout_seconds: float = SCRAPE_TIMEOUT_SECONDS,
        capacity_hint: CapacityHint | None = None,  # reads each page too (only when capacity is unset)
        kv_sizes: bool = False,  # token_capacity_per_dp_rank "auto": observations carry each Rank's KV size
    ) -> None:
        self._session = session
        self._capacity_hint = capacity_hint
        self._kv_sizes = kv_sizes
        self._headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._failing: dict[str, str] = {}  # base_url -> last error logged at WARN

    async def scrape(self, targets: Sequence[Target]) -> dict[str, BackendObservation]:
        """Observations keyed by target id; targets of failed or incomplete scrapes are absent."""
        by_worker: dict[str, list[Target]] = {}
        for target in targets:
            by_worker.setdefault(target.base_url, []).append(target)
        results = await asyncio.gather(*(self._scrape_worker(url, ts) for url, ts in by_worker.items()))
        merged: dict[str, BackendObservation] = {}
        for result in results:
            merged.update(result)
        return merged

    async def _scrape_worker(self, base_url: str, targets: Sequence[Target]) -> dict[str, BackendObservation]:
        url = base_url.rstrip("/") + "/metrics"
        try:
            # A redirect is a failed scrape, never followed: the bearer key goes to configured workers only.
            request = self._session.get(
                url, headers=self._headers, timeout=self._timeout, allow_redirects=False
            )
            async with request as response:
                if not 200 <= response.status < 300:
                    raise _ScrapeError(f"HTTP {response.status}")
                text = await response.text()
            parsed = parse_vllm_metrics(text)
        except _ScrapeError as exc:
            self._failed(base_url, str(exc))
            return {}
        except TimeoutError:
            self._failed(base_url, f"timed out after {self._timeout.total} s")
            return {}
        except (aiohttp.ClientError, ValueError) as exc:  # ValueError: malformed exposition or encoding
            self._failed(base_url, f"{type(exc).__name__}: {exc}")
            return {}
        if self._capacity_hint is not None:
            self._capacity_hint.saw(base_url, text, targets)
        if self._failing.pop(base_url, None) is not None:
            log.info("%s base_url=%s", RECOVERED_MESSAGE, base_url, extra={"base_url": base_url})
        return observations_for_targets(targets, parsed, kv_capacities(text) if self._kv_sizes else None)

    def _failed(self, base_url: str, error: str) -> None:
        repeated = self._failing.get(base_url) == error
        self._failing[base_url] = error
        level = logging.DEBUG if repeated else logging.WARNING
        log.log(
            level,
            "%s base_url=%s error=%s",
            FAILED_MESSAGE,
            base_url,
            error,
            extra={"base_url": base_url, "error": error},
        )


class _ScrapeError(Exception):
    pass


async def run_observation_loop(
    scraper: MetricsScraper,
    interval_seconds: float,
    targets: Callable[[], Sequence[Target]],
    begin: Callable[[], E],
    apply: Callable[[E, dict[str, BackendObservation]], None],
) -> None:
    """Every interval: ``begin()`` → scrape the current targets → ``apply(epoch, observations)``.

    Nothing is fetched while ``targets()`` is empty. A scrape that overruns its interval skips the missed
    ticks instead of bursting to catch up. Runs until cancelled.
    """
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while True:
        current = targets()
        if current:
            epoch = begin()
            observations = await scraper.scrape(current)
            apply(epoch, observations)
        next_at += interval_seconds
        now = loop.time()
        while next_at <= now:
            next_at += interval_seconds
        await asyncio.sleep(next_at - now)
