"""The shell of residency-aware Program scheduling (``residency_aware``): KV event subscribers per Rank, the
residency index they feed, and the prompt chain keys each Program's residency reports are made of.

Sources come from ``kv_event_sources`` (worker URL -> the endpoint of its ``--kv-events-config``; Rank r of a
worker publishes on port + r, as vLLM derives it), or with ``--policy kv_aware`` from the policy, whose index
this then reads (one subscriber per Rank either way). Token-id prompts are matched as they are; text and chat
prompts need ``--tokenizer`` (kv_aware's, when it runs), and a body over ``OFFLOAD_BYTES`` is tokenized in a
worker thread, off the event loop. Without a tokenizer a text or chat prompt leaves the Program unknown and
its scheduling as without residency.

Memory stays bounded (``agents.residency_prompts``: at most 64 sampled keys per Program, at most
``max_paused_programs + max_pooled_requests`` Programs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import zmq.asyncio
from prometheus_client import CollectorRegistry

from progrouter.agents.residency_prompts import ProgramKey, ProgramPrompts
from progrouter.config import ProgramSchedulingConfig, RouterConfig
from progrouter.engine.kv_events import rank_endpoint
from progrouter.observe.kv_events import KVEventMetrics, KVEventSubscriber, in_worker_thread
from progrouter.program import ResidencyReport
from progrouter.routing.kv_aware import OFFLOAD_BYTES, KvAwarePolicy
from progrouter.routing.kv_residency import ResidencyIndex, chain_keys
from progrouter.routing.target import Target
from progrouter.routing.tokenize import PromptTokenizer, needs_tokenizer, prompt_token_ids

log = logging.getLogger("progrouter.server.program_residency")  # the logger name its lines carry, kept


class ProgramResidency:
    """Index and remembered prompt keys (and, on its own sources, the subscribers feeding the index); the
    scheduler hears of them as plain reports."""

    def __init__(
        self,
        config: ProgramSchedulingConfig,
        registry: CollectorRegistry,
        *,
        tokenizer: PromptTokenizer | None = None,
        shared: ResidencyIndex | None = None,
        block_size: int | None = None,
    ) -> None:
        self.block_size = block_size or config.kv_event_block_size
        self.tokenizer = tokenizer
        self.index = ResidencyIndex() if shared is None else shared
        self._subscriptions = None if shared is not None else RankSubscriptions(config, self.index, registry)
        self._prompts = ProgramPrompts(
            self.block_size, config.max_paused_programs + config.max_pooled_requests
        )
        self._target_ids: list[str] = []

    @classmethod
    def from_config(
        cls, config: RouterConfig, registry: CollectorRegistry, kv_aware: KvAwarePolicy | None
    ) -> ProgramResidency | None:
        """The one place the gate learns whether Program scheduling reads KV events. With ``--policy
        kv_aware`` it reads the policy's index: one subscriber per Rank, one set of kv-events metrics, the
        policy's block size and tokenizer."""
        program = config.program_scheduling
        if program is None or not program.residency_aware:
            return None
        if kv_aware is not None:
            return cls(
                program,
                registry,
                tokenizer=kv_aware.tokenizer,
                shared=kv_aware.index,
                block_size=config.kv_event_block_size,
            )
        tokenizer = PromptTokenizer.load(config.tokenizer) if config.tokenizer is not None else None
        if tokenizer is None:
            log.warning("residency_aware: no --tokenizer, so only token-id prompts are matched")
        return cls(program, registry, tokenizer=tokenizer)

    def set_targets(self, targets: Sequence[Target]) -> None:
        self._target_ids = [t.id for t in targets]
        if self._subscriptions is not None:
            self._subscriptions.set_targets(targets)

    async def arrival(
        self, key: ProgramKey, body: Mapping[str, Any] | None, raw_body: bytes
    ) -> ResidencyReport | None:
        """Remember the prompt's chain keys for the Program; its report now (None: its ids are unknown)."""
        if self.tokenizer is not None and len(raw_body) >= OFFLOAD_BYTES and needs_tokenizer(body):
            keys = await in_worker_thread(lambda: self._keys(body))
        else:
            keys = self._keys(body)
        if keys is None:
            return None
        return self._prompts.arrival(key, keys, self.index.match, self._target_ids)

    def _keys(self, body: Mapping[str, Any] | None) -> list[int] | None:
        ids = prompt_token_ids(body, self.tokenizer)
        return None if ids is None else chain_keys(ids, self.block_size)

    def report(self, targets: Sequence[Target]) -> dict[ProgramKey, ResidencyReport]:
        """Every remembered Program's full-block tokens and resident tokens per known Rank (silent Ranks
        turn unknown first)."""
        self.index.expire(time.time())
        return self._prompts.report(self.index.match, [t.id for t in targets])

    async def stop(self) -> None:
        if self._subscriptions is not None:
            await self._subscriptions.stop()


class RankSubscriptions:
    """``kv_event_sources``' subscribers, one per healthy Rank, feeding ``index``."""

    def __init__(
        self, config: ProgramSchedulingConfig, index: ResidencyIndex, registry: CollectorRegistry
    ) -> None:
        self.index = index
        self._sources = {url.rstrip("/"): ep for url, ep in config.kv_event_sources.items()}
        self._replays = {url.rstrip("/"): ep for url, ep in config.kv_event_replay_sources.items()}
        self._metrics = KVEventMetrics(registry)
        self._ctx = zmq.asyncio.Context()
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def set_targets(self, targets: Sequence[Target]) -> None:
        """Subscribe to every Rank whose worker has a source; a Rank that left stops (and goes unknown)."""
        wanted = {t.id: t for t in targets if t.base_url in self._sources}
        for target_id in set(self._tasks) - set(wanted):
            self._tasks.pop(target_id).cancel()
        for target_id, target in wanted.items():
            if target_id in self._tasks:
                continue
            replay = self._replays.get(target.base_url)
            subscriber = KVEventSubscriber(
                self.index,
                target_id,
                rank_endpoint(self._sources[target.base_url], target.rank),
                None if replay is None else rank_endpoint(replay, target.rank),
                self._metrics,
                self._ctx,
            )
            self._tasks[target_id] = asyncio.get_running_loop().create_task(
                subscriber.run(), name=f"progrouter-kv-events-{target_id}"
            )

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._ctx.destroy(linger=0)
