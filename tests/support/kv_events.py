"""KV event endpoints on free loopback ports, for the emulator's ``kv_events_config``."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp


def free_port_pair() -> int:
    """A loopback port p with p + 1 free too (Rank r publishes on p + r)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise AssertionError("no free port pair")


def events_config(replay: bool = True) -> dict[str, Any]:
    """vLLM's ``--kv-events-config`` fields: ZMQ on loopback, with a replay endpoint unless told not to."""
    cfg: dict[str, Any] = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{free_port_pair()}",
    }
    if replay:
        cfg["replay_endpoint"] = f"tcp://127.0.0.1:{free_port_pair()}"
    return cfg


async def until_heard(
    engine_url: str,
    ranks: Sequence[int],
    heard: Callable[[int], bool],
    block_size: int,
    timeout: float = 10.0,
) -> None:
    """Send each Rank fresh prompts straight to it until ``heard(rank)``: the router's subscriber may connect
    after the engine published a batch, and ZMQ's SUB never sees what was sent before it joined."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        for n, rank in enumerate(r for r in ranks for _ in range(50)):  # at most 50 tries a Rank
            if heard(rank):
                continue
            assert time.monotonic() < deadline, f"Rank {rank}'s KV events were never heard"
            prompt = list(range(20_000 + 2 * block_size * n, 20_000 + 2 * block_size * (n + 1)))
            body = {"prompt": prompt, "max_tokens": 1}
            headers = {"X-data-parallel-rank": str(rank)}
            async with http.post(engine_url + "/v1/completions", json=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
            await asyncio.sleep(0.05)
    assert all(heard(r) for r in ranks), "KV events never heard"
