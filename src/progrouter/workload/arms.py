"""The bench's arms and emulator fleet, and the oracle's KV size: plain data the live bench and the
simulator share (no I/O here, so the simulator can import it without the HTTP client)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from progrouter.workload.trace import Trace


@dataclass(frozen=True, slots=True)
class ArmSpec:
    name: str
    policy: str = "consistent_hash"
    program: bool = False
    binding_only: bool = False
    unbounded_kv: bool = False
    upstream: bool = False
    kv_events: bool = False  # the engines publish vLLM KV events (Rank r of engine i on its base port + r)
    residency: bool = False  # the router's Program scheduling reads them (residency_aware; needs kv_events)


ARMS: dict[str, ArmSpec] = {
    "native": ArmSpec("native"),
    "round_robin": ArmSpec("round_robin", policy="round_robin"),
    "cache_aware": ArmSpec("cache_aware", policy="cache_aware"),
    "kv_aware": ArmSpec("kv_aware", policy="kv_aware", kv_events=True),
    "program": ArmSpec("program", program=True),
    "binding_only": ArmSpec("binding_only", program=True, binding_only=True),
    "program_residency": ArmSpec("program_residency", program=True, kv_events=True, residency=True),
    "oracle": ArmSpec("oracle", unbounded_kv=True),
    "upstream": ArmSpec("upstream", program=True, upstream=True),
}


@dataclass(frozen=True, slots=True)
class EngineFleet:
    """Emulator engines the bench starts (one process per engine, ``dp_size`` Ranks each)."""

    engines: int = 1
    dp_size: int = 2
    num_blocks: int = 4096
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    time_scale: float = 1.0
    extra_args: tuple[str, ...] = ()

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def argv(self, port: int, num_blocks: int, extra: tuple[str, ...] = ()) -> list[str]:
        return [
            sys.executable, "-m", "progrouter", "engine",
            "--host", "127.0.0.1", "--port", str(port),
            "--data-parallel-size", str(self.dp_size),
            "--num-blocks", str(num_blocks),
            "--block-size", str(self.block_size),
            "--max-num-seqs", str(self.max_num_seqs),
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
            "--max-model-len", str(self.max_model_len),
            "--time-scale", str(self.time_scale),
            "--log-level", "warning",
            *self.extra_args,
            *extra,
        ]  # fmt: skip


def kv_events_engine_args(base_port: int) -> tuple[str, ...]:
    """An emulator's ``--kv-events-config``: Rank r publishes on loopback port ``base_port + r``."""
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{base_port}"}
    return ("--kv-events-config", json.dumps(config))


def kv_events_router_args(urls: Sequence[str], base_ports: Sequence[int], fleet: EngineFleet) -> list[str]:
    """The router's ``--kv-event-source`` per engine (one endpoint per Rank), block size and model."""
    args = ["--kv-event-block-size", str(fleet.block_size), "--kv-event-model", "progrouter-bench"]
    for url, base in zip(urls, base_ports, strict=True):
        endpoints = ",".join(f"tcp://127.0.0.1:{base + r}" for r in range(fleet.dp_size))
        args += ["--kv-event-source", f"{url}={endpoints}"]
    return args


def trace_token_bounds(trace: Trace) -> tuple[int, int]:
    """(longest request in tokens incl. output, distinct tokens the whole trace would keep cached)."""
    longest = 0
    blocks = set()
    for task, p in trace.programs():
        for r in p.requests:
            longest = max(longest, r.input_tokens + r.output_tokens)
            for b in r.hash_ids:
                blocks.add(("shared", b) if b in trace.shared_hash_ids else (task.task_id, b))
    return longest, len(blocks) * trace.block_size + trace.num_requests * 64


def oracle_blocks(trace: Trace, fleet: EngineFleet) -> int:
    """KV blocks per Rank so that no Rank ever evicts: room for every distinct token plus outputs."""
    longest, distinct = trace_token_bounds(trace)
    tokens = max(distinct + sum(r.output_tokens for _t, p in trace.programs() for r in p.requests), longest)
    return max(fleet.num_blocks, -(-tokens // fleet.block_size) + 64)
