"""KV event endpoints on free loopback ports, for the emulator's ``kv_events_config``."""

from __future__ import annotations

import socket
from typing import Any


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
