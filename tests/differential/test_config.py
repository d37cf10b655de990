"""Where we deliberately differ: an unknown Program scheduling key is an error here, ignored by the wheel."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from .conftest import Launcher, WorkerFactory, flags
from .helpers import get
from .routers import StartupError, start_router


async def test_unknown_program_scheduling_key(
    workers: WorkerFactory, launch: Launcher, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    (worker,) = await workers(1)
    same = flags([worker.url], "--enable-program-scheduling", "--program-scheduling-config-json")
    same.append('{"no_such_key": 1}')
    upstream = await launch("upstream", same)
    assert (await get(http, upstream.url + "/scheduling/diagnostics")).status == 200  # ignored upstream
    with pytest.raises(StartupError, match="exited") as refused:
        await start_router("progrouter", same, tmp_path)
    assert "no_such_key" in refused.value.output
    assert "unrecognized arguments" not in refused.value.output  # refused for the key, not for a flag
