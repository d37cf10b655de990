"""Subscribes to one Rank's vLLM KV events (ZMQ SUB, msgpack) and feeds the residency index.

A gap in sequence numbers is repaired through the Rank's replay socket (DEALER: ``[b"", start_seq]``,
answered by ``[b"", topic, seq, payload]`` per batch and ``seq == -1`` at the end; older vLLM omits the
topic frame, both are read). What replay cannot fill is declared lost: the Rank's blocks are forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from progrouter.config import RouterConfig, parse_kv_sources
from progrouter.routing.kv_aware import KvAwarePolicy
from progrouter.routing.kv_residency import Applied, ResidencyIndex
from progrouter.routing.target import expand_targets

log = logging.getLogger(__name__)
REPLAY_TIMEOUT_SECONDS = 2.0
EXPIRE_INTERVAL_SECONDS = 1.0


# vLLM >= 0.28 sends each event as a tagged map ({"type": ..., field: ...}); older vLLM (and the emulator)
# as a tagged array in field order. The index reads the array layout; these are its fields per event type.
_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}
_MEDIUM_AT = {"BlockStored": 6, "BlockRemoved": 2}
GPU_MEDIA = (None, "GPU")
# Batch lag buckets: loopback delivery is sub-millisecond; seconds mean the router's loop fell behind.
LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _as_array(event: Any) -> list[Any]:
    if isinstance(event, dict):
        tag = event.get("type")
        if not isinstance(tag, str):
            raise ValueError("KV event map has no string 'type'")
        return [tag, *(event.get(name) for name in _FIELDS.get(tag, ()))]
    if isinstance(event, list) and event and isinstance(event[0], str):
        return event
    raise ValueError("KV event is neither a tagged map nor a tagged array")


def _on_gpu(event: list[Any]) -> bool:
    """Only device-tier blocks are credited: an offloaded (CPU, disk) copy is not a prefix-cache hit here."""
    at = _MEDIUM_AT.get(event[0])
    return at is None or len(event) <= at or event[at] in GPU_MEDIA


def decode_batch(payload: bytes) -> tuple[float, list[list[Any]]]:
    """``(ts, events)`` of a KVEventBatch, events in the array layout; ValueError if it is not one."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ValueError(f"KV event batch is not msgpack: {exc}") from exc
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise ValueError("KV event batch is not [ts, events, ...]")
    return float(batch[0]), _device_events(batch[1])


def _device_events(raw_events: list[Any]) -> list[list[Any]]:
    """The device-tier events in the array layout, each run of ``BlockRemoved`` as one
    ``["BlockRemoved", hashes]`` (every kept event is device-tier, so the medium is dropped).

    An engine evicting for a long prompt sends one ``BlockRemoved`` per block (vLLM does), most of a batch's
    events: a run of them becomes one event carrying every hash, in order, and a removal sent as a map is
    read without building its array first (per-event work was the largest part of kv_aware's event CPU)."""
    events: list[list[Any]] = []
    removed: list[Any] | None = None  # the hashes of the run of removals being read
    for raw in raw_events:
        if type(raw) is dict and raw.get("type") == "BlockRemoved":
            if raw.get("medium") not in GPU_MEDIA:
                continue
            hashes = raw.get("block_hashes")
        else:
            event = _as_array(raw)
            if not _on_gpu(event):
                continue
            if event[0] != "BlockRemoved":
                removed = None
                events.append(event)
                continue
            hashes = event[1] if len(event) > 1 else None
        if not isinstance(hashes, list):
            raise ValueError("KV event BlockRemoved has no list of block hashes")
        if removed is None:
            removed = []
            events.append(["BlockRemoved", removed])
        removed.extend(hashes)
    return events


class KVEventMetrics:
    """Lag (the last batch's, and every batch's in a histogram), gaps and index size; the ``source`` label is
    one configured Rank (bounded)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.lag = Gauge(
            "progrouter_kv_events_lag_seconds", "Age of the last applied batch", ["source"], registry=registry
        )
        self.batch_lag = Histogram(
            "progrouter_kv_events_batch_lag_seconds",
            "Age of each applied batch when the index applied it (its publish time to now)",
            ["source"],
            buckets=LAG_BUCKETS,
            registry=registry,
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
        """Wait for the socket to be readable, then take every queued batch without waiting: an engine sends
        one batch per step, and one asyncio future per batch cost more router CPU than the batch itself."""
        queued: zmq.Socket[bytes] = zmq.Socket.shadow(self._sub.underlying)  # same socket, no futures
        try:
            while True:
                await self._sub.poll()  # readable (POLLIN is the default), no timeout
                while True:
                    try:
                        frames = queued.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if len(frames) == 3:
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
            lag = self.index.rank(self.source).lag_seconds
            self.metrics.lag.labels(self.source).set(lag)
            self.metrics.batch_lag.labels(self.source).observe(lag)
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


@dataclass(frozen=True, slots=True)
class RankSource:
    """Where one target's (worker URL, DP Rank) events come from; the index knows it by the target id."""

    target_id: str
    endpoint: str
    replay_endpoint: str | None


def rank_sources(config: RouterConfig) -> list[RankSource]:
    """``--kv-event-source URL=EP0,EP1,...`` (and the matching replay source) per target, Rank order."""
    sources = parse_kv_sources(config.kv_event_source, "kv_event_source")
    replays = parse_kv_sources(config.kv_event_replay_source, "kv_event_replay_source")
    out = []
    for target in expand_targets(list(sources), config.intra_node_data_parallel_size):
        replay = replays.get(target.base_url)
        out.append(
            RankSource(
                target.id, sources[target.base_url][target.rank], replay[target.rank] if replay else None
            )
        )
    return out


async def in_worker_thread(work: Callable[[], Any]) -> Any:
    """kv_aware's offload: long prompts are tokenized in the loop's default thread pool."""
    return await asyncio.get_running_loop().run_in_executor(None, work)


def kv_events_context(
    policy: KvAwarePolicy, config: RouterConfig, registry: CollectorRegistry
) -> Callable[[Any], contextlib.AbstractAsyncContextManager[None]]:
    """An aiohttp ``cleanup_ctx`` entry for kv_aware: subscribers for every configured Rank feeding its
    index, the silence check, and its worker thread for long prompts."""
    index = policy.index

    @contextlib.asynccontextmanager
    async def running(_app: Any) -> AsyncIterator[None]:
        policy.offload = in_worker_thread
        sources = rank_sources(config)
        if not sources:
            log.warning("kv_aware: no --kv-event-source, so every Rank is scored on load only")
        metrics = KVEventMetrics(registry)
        ctx = zmq.asyncio.Context()
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(
                KVEventSubscriber(index, s.target_id, s.endpoint, s.replay_endpoint, metrics, ctx).run(),
                name=f"progrouter-kv-events-{s.target_id}",
            )
            for s in sources
        ]
        tasks.append(loop.create_task(_expire_silent(index), name="progrouter-kv-events-expire"))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            ctx.destroy(linger=0)  # also closes the sockets of subscribers cancelled before they ran

    return running


async def _expire_silent(index: ResidencyIndex) -> None:
    while True:
        await asyncio.sleep(EXPIRE_INTERVAL_SECONDS)
        index.expire(time.time())
