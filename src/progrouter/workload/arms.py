"""The bench's arms and emulator fleet, and the oracle's KV size: plain data the live bench and the
simulator share (no I/O here, so the simulator can import it without the HTTP client)."""

from __future__ import annotations

import sys
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
    residency: bool = False  # the engines publish KV events and the router reads them (residency_aware)


ARMS: dict[str, ArmSpec] = {
    "native": ArmSpec("native"),
    "round_robin": ArmSpec("round_robin", policy="round_robin"),
    "program": ArmSpec("program", program=True),
    "binding_only": ArmSpec("binding_only", program=True, binding_only=True),
    "program_residency": ArmSpec("program_residency", program=True, residency=True),
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
