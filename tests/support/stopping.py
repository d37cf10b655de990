"""One shape for every "start things during a test, stop them all after" fixture."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import ParamSpec, Protocol, TypeVar

P = ParamSpec("P")


class Stoppable(Protocol):
    async def stop(self) -> None: ...


S = TypeVar("S", bound=Stoppable)


@asynccontextmanager
async def stopping(start: Callable[P, Awaitable[S]]) -> AsyncIterator[Callable[P, Awaitable[S]]]:
    """Yield ``start`` wrapped so that everything it started is stopped (in start order) on exit."""
    started: list[S] = []

    async def tracked(*args: P.args, **kwargs: P.kwargs) -> S:
        thing = await start(*args, **kwargs)
        started.append(thing)
        return thing

    try:
        yield tracked
    finally:
        for thing in started:
            await thing.stop()
