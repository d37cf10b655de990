"""Active health checks per worker base URL: a worker flips state only after N consecutive results.

``HealthTracker`` is the counting (no I/O, testable alone); ``HealthChecker`` is the loop that feeds it.
All Ranks of a worker share its state, since they share its process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import aiohttp

log = logging.getLogger("progrouter.health")


class HealthTracker:
    """Healthy until ``failure_threshold`` consecutive failures; healthy again after ``success_threshold``."""

    def __init__(
        self,
        workers: Sequence[str],
        failure_threshold: int,
        success_threshold: int,
        *,
        initially_healthy: bool = True,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.success_threshold = success_threshold
        self.healthy: dict[str, bool] = {}  # in the order workers were added
        self._streak: dict[str, int] = {}  # consecutive results against the state
        for worker in workers:
            self.add(worker, initially_healthy)

    def add(self, worker: str, healthy: bool) -> None:
        """Track ``worker`` (again) from the given state, with no streak."""
        self.healthy[worker] = healthy
        self._streak[worker] = 0

    def remove(self, worker: str) -> None:
        self.healthy.pop(worker, None)
        self._streak.pop(worker, None)

    def record(self, worker: str, ok: bool) -> bool:
        """Count one check result; True when it changed the worker's state (False for a removed worker)."""
        if worker not in self.healthy:
            return False
        if ok == self.healthy[worker]:
            self._streak[worker] = 0
            return False
        self._streak[worker] += 1
        if self._streak[worker] >= (self.success_threshold if ok else self.failure_threshold):
            self.healthy[worker] = ok
            self._streak[worker] = 0
            return True
        return False

    def unhealthy(self) -> list[str]:
        return [w for w, ok in self.healthy.items() if not ok]


class HealthChecker:
    """Checks every worker each interval, all at once; calls ``on_change`` after any state flip."""

    def __init__(
        self,
        tracker: HealthTracker,
        session: aiohttp.ClientSession,
        *,
        endpoint: str,
        interval: float,
        timeout: float,
        headers: dict[str, str],
        on_change: Callable[[], None],
    ) -> None:
        self.tracker = tracker
        self._session = session
        self._endpoint = endpoint if endpoint.startswith("/") else "/" + endpoint
        self._interval = interval
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._headers = headers
        self._on_change = on_change

    async def probe(self, worker: str) -> bool:
        """One check of ``worker``: True when its health endpoint answers 200 in time.

        A redirect is a failed check, never followed: the router contacts configured workers only.
        """
        try:
            async with self._session.get(
                worker + self._endpoint, headers=self._headers, timeout=self._timeout, allow_redirects=False
            ) as resp:
                await resp.read()
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("health check of %s failed: %r", worker, exc)
            return False

    async def check_once(self) -> None:
        workers = list(self.tracker.healthy)
        results = await asyncio.gather(*(self.probe(w) for w in workers))
        changed = False
        for worker, ok in zip(workers, results, strict=True):
            if self.tracker.record(worker, ok):
                changed = True
                log.warning("worker %s is now %s", worker, "healthy" if ok else "unhealthy")
        if changed:
            self._on_change()

    async def run(self) -> None:
        while True:
            await self.check_once()
            await asyncio.sleep(self._interval)

    async def wait_for_answer(self, workers: Sequence[str], timeout: float, interval: float) -> list[str]:
        """Probe ``workers`` every ``interval`` until at least one answers; those that did ([] on timeout).

        What upstream does at startup and in ``/add_worker``: the caller waits, bounded by ``timeout``.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            results = await asyncio.gather(*(self.probe(w) for w in workers))
            answered = [w for w, ok in zip(workers, results, strict=True) if ok]
            left = deadline - loop.time()
            if answered or left <= 0:
                return answered
            await asyncio.sleep(min(interval, left))
