"""The inbound limit: a token bucket in front of the proxy, with a FIFO queue of waiters.

Upstream vllm-router 0.1.17's semantics, as observed: the bucket holds ``max_concurrent_requests`` tokens
and refills at ``rate_limit_tokens_per_second`` (default: the same number); a request takes one and gives it
back when it is answered. Because tokens also refill with time, an arriving request can overtake a long one:
the limit is on the rate of admissions as much as on concurrency. A request that finds no token waits (with
``queue_size`` 0 it gets 429 with ``Retry-After: 1`` at once instead). Waiters move only when a token is given
back (then as many, in arrival order, as the bucket holds, refilled tokens too); a waiter not admitted within
``queue_timeout_secs`` of its arrival gets 408. As upstream's, the queue refuses nobody for being full: past
``queue_size`` places requests wait to enter it, on the same timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable

from progrouter.config import RouterConfig


class TokenBucket:
    """Sans-I/O: ``capacity`` tokens, ``rate`` tokens per second refill; starts full."""

    __slots__ = ("_stamp", "capacity", "rate", "tokens")

    def __init__(self, capacity: float, rate: float, now: float) -> None:
        self.capacity = capacity
        self.rate = rate
        self.tokens = capacity
        self._stamp = now

    def _refill(self, now: float) -> None:
        if now > self._stamp:
            self.tokens = min(self.capacity, self.tokens + (now - self._stamp) * self.rate)
        self._stamp = max(self._stamp, now)

    def take(self, now: float) -> bool:
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def give_back(self, now: float) -> None:
        self._refill(now)
        self.tokens = min(self.capacity, self.tokens + 1.0)


class Rejected(Exception):
    """The limiter refused a request: ``status`` 429 (no token and no queue) or 408 (waited too long)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class InboundLimiter:
    def __init__(
        self,
        capacity: int,
        rate: float,
        queue_size: int,
        queue_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self.bucket = TokenBucket(capacity, rate, clock())
        self.queue_size = queue_size
        self.queue_timeout = queue_timeout
        self._waiters: deque[asyncio.Future[None]] = deque()

    @classmethod
    def from_config(cls, config: RouterConfig) -> InboundLimiter:
        rate = config.rate_limit_tokens_per_second or config.max_concurrent_requests
        return cls(config.max_concurrent_requests, rate, config.queue_size, config.queue_timeout_secs)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def try_take(self) -> bool:
        """Take a token now if the bucket has one, refilled ones too (the usual case: no coroutine)."""
        return self.bucket.take(self._clock())

    async def acquire(self) -> None:
        """Take a token, waiting for one given back if there is a queue; raises Rejected otherwise."""
        if self.try_take():
            return
        if self.queue_size == 0:
            raise Rejected(429, "queue_full", "too many requests: the router has no free slot and no queue")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.queue_timeout)
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the token arrived as we gave up: pass it on
            else:
                waiter.cancel()
                self._discard(waiter)
            if isinstance(exc, TimeoutError):
                raise Rejected(
                    408, "queue_timeout", f"request waited {self.queue_timeout:g} s in the router's queue"
                ) from None
            raise

    def release(self) -> None:
        """A request that held a token is done: its token, and any refilled ones, go to the waiters."""
        self.bucket.give_back(self._clock())
        if self._waiters:
            self._admit()

    def _discard(self, waiter: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)

    def _admit(self) -> None:
        now = self._clock()
        while self._waiters:
            if self._waiters[0].done():  # gave up between its timeout and this call
                self._waiters.popleft()
            elif self.bucket.take(now):
                self._waiters.popleft().set_result(None)
            else:
                break
