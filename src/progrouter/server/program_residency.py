"""The shell of residency-aware Program scheduling (``residency_aware``): KV event subscribers per Rank, the
residency index they feed, and the prompt chain keys each Program's residency reports are made of.

Sources come from ``kv_event_sources`` (worker URL -> the endpoint of its ``--kv-events-config``; Rank r of a
worker publishes on port + r, as vLLM derives it). A Program's prompt is matched only when the request gives
it as token ids (``prompt``: a list of ints), so no request costs a tokenizer call; a text or chat prompt
leaves the Program unknown and its scheduling as without residency.

Memory stays bounded (``program.residency_prompts``: at most 64 sampled keys per Program, at most
``max_paused_programs + max_pooled_requests`` Programs).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import zmq.asyncio
from prometheus_client import CollectorRegistry

from progrouter.config import ProgramSchedulingConfig, RouterConfig
from progrouter.engine.kv_events import rank_endpoint
from progrouter.observe.kv_events import KVEventMetrics, KVEventSubscriber
from progrouter.program.residency import Report
from progrouter.program.residency_prompts import ProgramKey, ProgramPrompts
from progrouter.routing.kv_residency import ResidencyIndex, chain_keys
from progrouter.routing.target import Target


def prompt_token_ids(body: Mapping[str, Any] | None) -> list[int] | None:
    """The prompt when the request gives it as token ids (a completions ``prompt`` list of ints)."""
    prompt = None if body is None else body.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    return None


class ProgramResidency:
    """Index and remembered prompt keys (and, on its own sources, the subscribers feeding the index); the
    scheduler hears of them as plain reports."""

    def __init__(
        self,
        config: ProgramSchedulingConfig,
        registry: CollectorRegistry,
        *,
        shared: ResidencyIndex | None = None,
        block_size: int | None = None,
    ) -> None:
        self.block_size = block_size or config.kv_event_block_size
        self.index = ResidencyIndex() if shared is None else shared
        self._subscriptions = None if shared is not None else RankSubscriptions(config, self.index, registry)
        self._prompts = ProgramPrompts(
            self.block_size, config.max_paused_programs + config.max_pooled_requests
        )

    @classmethod
    def from_config(
        cls, config: RouterConfig, registry: CollectorRegistry, kv_index: ResidencyIndex | None
    ) -> ProgramResidency | None:
        """The one place the gate learns whether Program scheduling reads KV events. With ``--policy
        kv_aware`` (``kv_index``: the policy's) it reads the policy's index: one subscriber per Rank, one set
        of kv-events metrics, the policy's block size."""
        program = config.program_scheduling
        if program is None or not program.residency_aware:
            return None
        if kv_index is None:
            return cls(program, registry)
        return cls(program, registry, shared=kv_index, block_size=config.kv_event_block_size)

    def set_targets(self, targets: Sequence[Target]) -> None:
        if self._subscriptions is not None:
            self._subscriptions.set_targets(targets)

    def arrival(
        self, key: ProgramKey, body: Mapping[str, Any] | None, targets: Sequence[Target]
    ) -> Report | None:
        """Remember the prompt's chain keys for the Program; its report now (None: not token ids)."""
        tokens = prompt_token_ids(body)
        if tokens is None:
            return None
        keys = chain_keys(tokens, self.block_size)
        return self._prompts.arrival(key, keys, self.index.match, [t.id for t in targets])

    def report(self, targets: Sequence[Target]) -> dict[ProgramKey, Report]:
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
