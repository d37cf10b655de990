"""The KV event sockets of one Rank (the engine's shell): a ZMQ PUB for live batches, a ROUTER for replay.

Frames as vLLM sends them: live ``[topic, seq (8 bytes big-endian), payload]``; a replay request is
``[identity, b"", start_seq (8 bytes)]`` on the ROUTER and is answered with ``[identity, b"", topic, seq,
payload]`` per buffered batch from ``start_seq`` on, then ``[identity, b"", b"", END_SEQ, b""]``. A slow
subscriber loses batches at the high-water mark (the PUB never blocks the engine) and sees the gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import zmq
import zmq.asyncio

from progrouter.engine.kv_events import (
    END_SEQ,
    EventStream,
    KVEventRecorder,
    KVEventsConfig,
    encode_batch,
    rank_endpoint,
)

log = logging.getLogger(__name__)


def _seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


class RankEventPublisher:
    """Publishes one Rank's recorded events, one batch per engine step that changed its prefix cache."""

    def __init__(self, config: KVEventsConfig, rank: int, recorder: KVEventRecorder) -> None:
        self.rank = rank
        self.recorder = recorder
        self.stream = EventStream(config.buffer_steps)
        self._topic = config.topic.encode()
        self._ctx = zmq.asyncio.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self.endpoint = rank_endpoint(config.endpoint, rank)
        self.replay_endpoint = (
            rank_endpoint(config.replay_endpoint, rank) if config.replay_endpoint is not None else None
        )
        try:
            self._pub.bind(self.endpoint)
            if self.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(self.replay_endpoint)
        except zmq.ZMQError:
            self.close_sockets()
            raise

    def start(self) -> None:
        if self._replay is not None:
            self._replay_task = asyncio.get_running_loop().create_task(self._serve_replay())

    def flush(self) -> None:
        """Publish the events recorded since the last flush as one batch (nothing if there are none)."""
        events = self.recorder.take()
        if not events:
            return
        payload = encode_batch(time.time(), events, self.rank)
        seq = self.stream.append(payload)
        with contextlib.suppress(zmq.Again):  # at the high-water mark: dropped, the subscriber sees the gap
            self._pub.send_multipart((self._topic, _seq_bytes(seq), payload), flags=zmq.NOBLOCK)

    async def _serve_replay(self) -> None:
        sock = self._replay
        assert sock is not None
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3:
                log.warning("KV event replay: ignoring a request of %d frames (want 3)", len(frames))
                continue
            client, _, start = frames
            for seq, payload in self.stream.replay_from(int.from_bytes(start, "big", signed=True)):
                await sock.send_multipart((client, b"", self._topic, _seq_bytes(seq), payload))
            await sock.send_multipart((client, b"", b"", _seq_bytes(END_SEQ), b""))

    async def stop(self) -> None:
        task = self._replay_task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.close_sockets()

    def close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
