"""vLLM's KV events, sans-I/O: the ``--kv-events-config`` model, the pool's event sink, the wire format.

vLLM (``vllm/distributed/kv_events.py``) publishes, per DP Rank and per engine step that changed the prefix
cache, one msgpack ``KVEventBatch``: the array ``[ts, events]`` plus ``data_parallel_rank`` when set. Since
vLLM 0.11 each event is a map tagged by ``type`` (older vLLM sent tagged arrays): ``{"type": "BlockStored",
"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
"extra_keys", "group_idx", "kv_cache_spec_kind"}``, ``{"type": "BlockRemoved", "block_hashes": [one hash],
"medium", "group_idx"}`` per evicted block, or ``{"type": "AllBlocksCleared"}``. Hashes are unsigned 64-bit
integers (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, the default). Every batch gets the next sequence number of
its Rank (from 0) and stays in a replay buffer of ``buffer_steps`` batches. The sockets
(``kv_events_publisher.py``) are the shell's; this module decides what goes on them.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any, Literal

import msgpack
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MEDIUM_GPU = "GPU"  # vLLM's medium for blocks in the GPU prefix cache (the only tier the emulator has)
FULL_ATTENTION = "full_attention"  # the KV cache spec of the one group the emulator has (group 0)
HASH_MASK = (1 << 64) - 1  # vLLM publishes block hashes as unsigned 64-bit integers
END_SEQ = -1  # the replay socket's "no more batches" sequence number


class KVEventsConfig(BaseModel):
    """vLLM's ``KVEventsConfig`` (the JSON of ``--kv-events-config``), same field names and defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enable_kv_cache_events: bool = False
    publisher: Literal["null", "zmq"] | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = Field(default=10_000, ge=1)
    hwm: int = Field(default=100_000, ge=0)
    max_queue_size: int = Field(default=100_000, ge=1)
    topic: str = ""

    @property
    def publishes(self) -> bool:
        """vLLM publishes only with events enabled and a ``zmq`` publisher (its default when enabled)."""
        return self.enable_kv_cache_events and self.publisher in (None, "zmq")


def parse_kv_events_config(text: str) -> KVEventsConfig:
    """The ``--kv-events-config`` flag's JSON; a ValueError that names the problem otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--kv-events-config is not JSON: {exc}") from exc
    try:
        return KVEventsConfig.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"--kv-events-config: {exc}") from exc


def rank_endpoint(endpoint: str, rank: int) -> str:
    """Rank ``rank``'s endpoint, as vLLM derives it: TCP port + rank, ``_dp<rank>`` after ipc/inproc paths."""
    if rank == 0:
        return endpoint
    if endpoint.startswith(("ipc://", "inproc://")):
        return f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        if not port.isdigit() or "://" not in base:
            raise ValueError(f"KV event endpoint {endpoint!r} needs a TCP port")
        if int(port) + rank > 65535:
            raise ValueError(f"KV event endpoint {endpoint!r}: Rank {rank}'s port is above 65535")
        return f"{base}:{int(port) + rank}"
    raise ValueError(f"KV event endpoint {endpoint!r} must start with tcp://, ipc:// or inproc://")


class KVEventRecorder:
    """The block pool's event sink for one Rank: collects the events of the current step as vLLM's maps.

    The emulator has no LoRA, multimodal inputs or second KV group, so ``lora_*`` are None, ``group_idx`` is
    0 and ``extra_keys`` holds None per block (vLLM puts a cache salt there; the emulator's hashes cover the
    salt, its events do not carry it)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.pending: list[dict[str, Any]] = []

    def blocks_stored(self, block_hashes: list[int], parent_hash: int | None, token_ids: list[int]) -> None:
        self.pending.append(
            {
                "type": "BlockStored",
                "block_hashes": [h & HASH_MASK for h in block_hashes],
                "parent_block_hash": None if parent_hash is None else parent_hash & HASH_MASK,
                "token_ids": token_ids,
                "block_size": self.block_size,
                "lora_id": None,
                "medium": MEDIUM_GPU,
                "lora_name": None,
                "extra_keys": [None] * len(block_hashes),
                "group_idx": 0,
                "kv_cache_spec_kind": FULL_ATTENTION,
            }
        )

    def blocks_removed(self, block_hashes: list[int]) -> None:
        """One event per evicted block, in eviction order, as vLLM sends them."""
        self.pending.extend(
            {"type": "BlockRemoved", "block_hashes": [h & HASH_MASK], "medium": MEDIUM_GPU, "group_idx": 0}
            for h in block_hashes
        )

    def all_cleared(self) -> None:
        self.pending.append({"type": "AllBlocksCleared"})

    def take(self) -> list[dict[str, Any]]:
        """The events since the last call (the step's batch), in the order they happened."""
        events, self.pending = self.pending, []
        return events


def encode_batch(ts: float, events: list[dict[str, Any]], rank: int | None) -> bytes:
    """One ``KVEventBatch`` in vLLM's msgpack layout (``data_parallel_rank`` omitted when None)."""
    batch: list[Any] = [float(ts), events] if rank is None else [float(ts), events, rank]
    return msgpack.packb(batch, use_bin_type=True)  # type: ignore[no-any-return]


class EventStream:
    """One Rank's sequence numbers and replay buffer: what was published, in order, for late subscribers."""

    def __init__(self, buffer_steps: int) -> None:
        self.next_seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)

    def append(self, payload: bytes) -> int:
        """Number the next batch and keep it for replay; returns its sequence number."""
        seq = self.next_seq
        self.next_seq += 1
        self._buffer.append((seq, payload))
        return seq

    def replay_from(self, start_seq: int) -> list[tuple[int, bytes]]:
        """Every buffered batch from ``start_seq`` on (older ones are gone: a subscriber sees the gap)."""
        return [(seq, payload) for seq, payload in self._buffer if seq >= start_seq]
