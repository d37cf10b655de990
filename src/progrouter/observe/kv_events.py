"""Subscribes to one Rank's vLLM KV events (ZMQ SUB, msgpack) and feeds the residency index.

A gap in sequence numbers is repaired through the Rank's replay socket (DEALER: ``[b"", start_seq]``,
answered by ``[b"", topic, seq, payload]`` per batch and ``seq == -1`` at the end; older vLLM omits the
topic frame, both are read). What replay cannot fill is declared lost: the Rank's blocks are forgotten.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import msgpack
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry, Counter, Gauge

from progrouter.routing.kv_residency import Applied, ResidencyIndex

log = logging.getLogger(__name__)
REPLAY_TIMEOUT_SECONDS = 2.0


# The fields of vLLM's map-encoded events (vLLM >= 0.11), in the order of the older tagged-array layout.
_ARRAY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def _as_array(event: Any) -> list[Any]:
    """One event as the tagged array the index reads: vLLM's maps (``{"type": ...}``) and the older arrays."""
    if isinstance(event, list) and event and isinstance(event[0], str):
        return event
    if isinstance(event, dict) and event.get("type") in _ARRAY_FIELDS:
        tag = event["type"]
        return [tag, *(event.get(name) for name in _ARRAY_FIELDS[tag])]
    raise ValueError("KV event is neither a tagged map nor a tagged array")


def decode_batch(payload: bytes) -> tuple[float, list[list[Any]]]:
    """``(ts, events)`` of a KVEventBatch, each event a tagged array; ValueError if the payload is not one."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ValueError(f"KV event batch is not msgpack: {exc}") from exc
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise ValueError("KV event batch is not [ts, events, ...]")
    return float(batch[0]), [_as_array(e) for e in batch[1]]


class KVEventMetrics:
    """Lag, gaps and index size; the ``source`` label is one configured Rank (bounded)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.lag = Gauge(
            "progrouter_kv_events_lag_seconds", "Age of the last applied batch", ["source"], registry=registry
        )
        self.gaps = Counter(
            "progrouter_kv_events_gaps_total", "Sequence gaps seen", ["source", "outcome"], registry=registry
        )
        self.blocks = Gauge("progrouter_kv_index_blocks", "Blocks in the residency index", registry=registry)


class KVEventSubscriber:
    """One Rank's event stream into ``index`` under ``source`` (e.g. ``"http://w:8000#0"``)."""

    def __init__(
        self,
        index: ResidencyIndex,
        source: str,
        endpoint: str,
        replay_endpoint: str | None,
        metrics: KVEventMetrics,
        ctx: zmq.asyncio.Context,
    ) -> None:
        self.index, self.source, self.metrics = index, source, metrics
        self.replay_endpoint = replay_endpoint
        self._ctx = ctx
        self._sub = ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(endpoint)

    async def run(self) -> None:
        try:
            while True:
                frames = await self._sub.recv_multipart()
                if len(frames) != 3:
                    continue
                await self._receive(int.from_bytes(frames[1], "big", signed=True), frames[2])
        finally:
            self._sub.close(linger=0)

    async def _receive(self, seq: int, payload: bytes) -> None:
        """Apply a live batch; after a gap, repair first (live batches wait in the SUB queue meanwhile)."""
        try:
            ts, events = decode_batch(payload)
        except ValueError as exc:
            log.warning("KV events from %s: %s", self.source, exc)
            return
        if self._apply(seq, ts, events) is Applied.GAP:
            self.index.record_gap(self.source)
            await self._repair(seq, ts, events)

    def _apply(self, seq: int, ts: float, events: list[list[Any]]) -> Applied:
        now = time.time()
        applied = self.index.apply(self.source, seq, ts, events, now)
        if applied is Applied.OK:
            self.metrics.lag.labels(self.source).set(self.index.rank(self.source).lag_seconds)
            self.metrics.blocks.set(self.index.size())
        return applied

    async def _repair(self, seq: int, ts: float, events: list[list[Any]]) -> None:
        """Replay from the expected sequence number; what is still missing afterwards is lost."""
        state = self.index.rank(self.source)
        if self.replay_endpoint is not None and state.next_seq is not None:
            await self._replay(state.next_seq)
        if state.next_seq is not None and state.next_seq < seq:
            self.index.skip_gap(self.source, seq)
            self.metrics.gaps.labels(self.source, "lost").inc()
        else:
            self.metrics.gaps.labels(self.source, "repaired").inc()
        self._apply(seq, ts, events)

    async def _replay(self, start: int) -> None:
        assert self.replay_endpoint is not None
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        try:
            await dealer.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), REPLAY_TIMEOUT_SECONDS)
                seq_frame, payload = frames[-2], frames[-1]
                seq = int.from_bytes(seq_frame, "big", signed=True)
                if seq < 0:
                    return
                ts, events = decode_batch(payload)
                self._apply(seq, ts, events)
        except (TimeoutError, ValueError) as exc:
            log.warning("KV event replay from %s failed: %s", self.source, exc)
        finally:
            dealer.close(linger=0)
