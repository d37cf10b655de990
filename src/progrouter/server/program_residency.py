"""The shell of residency-aware Program scheduling (``residency_aware``): KV event subscribers per Rank, the
residency index they feed, and the prompt chain keys each Program's residency reports are made of.

Sources come from ``kv_event_sources`` (worker URL -> the endpoint of its ``--kv-events-config``; Rank r of a
worker publishes on port + r, as vLLM derives it). A Program's prompt is matched only when the request gives
it as token ids (``prompt``: a list of ints), so no request costs a tokenizer call; a text or chat prompt
leaves the Program unknown and its scheduling as without residency.

Memory and CPU stay small whatever the context length: a Program keeps at most ``SAMPLED_BLOCKS`` chain keys
of its prompt (its blocks at evenly spaced positions, the last one included; all of them for a prompt of up
to that many blocks), and remembered Programs are at most ``max_paused_programs + max_pooled_requests``,
least recently seen forgotten first. A Rank holds a prompt up to the last sampled block of the leading run it
holds (vLLM evicts a chain tail first, so what a Rank holds of it is a prefix); between samples this rounds
down, by at most 1/64 of the prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import zmq.asyncio
from prometheus_client import CollectorRegistry

from progrouter.config import ProgramSchedulingConfig
from progrouter.engine.kv_events import rank_endpoint
from progrouter.observe.kv_events import KVEventMetrics, KVEventSubscriber
from progrouter.routing.kv_residency import ResidencyIndex, chain_keys
from progrouter.routing.target import Target

ProgramKey = tuple[str, str]  # (model pool, Program id)
SAMPLED_BLOCKS = 64


class PromptSample(NamedTuple):
    """Chain keys of a prompt's blocks at ``positions`` (block indexes, ascending, the last block last)."""

    positions: tuple[int, ...]
    keys: tuple[int, ...]

    @classmethod
    def of(cls, keys: list[int]) -> PromptSample:
        n = len(keys)
        if n <= SAMPLED_BLOCKS:
            return cls(tuple(range(n)), tuple(keys))
        positions = sorted({(i + 1) * n // SAMPLED_BLOCKS - 1 for i in range(SAMPLED_BLOCKS)})
        return cls(tuple(positions), tuple(keys[i] for i in positions))

    @property
    def blocks(self) -> int:
        return self.positions[-1] + 1 if self.positions else 0


def prompt_token_ids(body: Mapping[str, Any] | None) -> list[int] | None:
    """The prompt when the request gives it as token ids (a completions ``prompt`` list of ints)."""
    prompt = None if body is None else body.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    return None


class ProgramResidency:
    """Subscribers, index and remembered prompt keys; the scheduler hears of them as plain reports."""

    def __init__(self, config: ProgramSchedulingConfig, registry: CollectorRegistry) -> None:
        self.block_size = config.kv_event_block_size
        self.index = ResidencyIndex()
        self._sources = {url.rstrip("/"): ep for url, ep in config.kv_event_sources.items()}
        self._replays = {url.rstrip("/"): ep for url, ep in config.kv_event_replay_sources.items()}
        self._metrics = KVEventMetrics(registry)
        self._ctx = zmq.asyncio.Context()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._prompts: OrderedDict[ProgramKey, PromptSample] = OrderedDict()
        self._max_programs = config.max_paused_programs + config.max_pooled_requests

    @classmethod
    def from_config(
        cls, config: ProgramSchedulingConfig, registry: CollectorRegistry
    ) -> ProgramResidency | None:
        """The one place the gate learns whether Program scheduling reads KV events."""
        return cls(config, registry) if config.residency_aware else None

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

    def arrival(
        self, key: ProgramKey, body: Mapping[str, Any] | None, targets: Sequence[Target]
    ) -> dict[str, int] | None:
        """Remember the prompt's chain keys for the Program; the tokens of it each known Rank holds now."""
        tokens = prompt_token_ids(body)
        if tokens is None:
            return None
        sample = PromptSample.of(chain_keys(tokens, self.block_size))
        self._prompts[key] = sample
        self._prompts.move_to_end(key)
        while len(self._prompts) > self._max_programs:
            self._prompts.popitem(last=False)
        return self._resident(sample, targets)

    def report(self, targets: Sequence[Target]) -> dict[ProgramKey, tuple[int, dict[str, int]]]:
        """Every remembered Program's full-block tokens and resident tokens per known Rank (silent Ranks
        turn unknown first)."""
        self.index.expire(time.time())
        size = self.block_size
        return {key: (s.blocks * size, self._resident(s, targets)) for key, s in self._prompts.items()}

    def _resident(self, sample: PromptSample, targets: Sequence[Target]) -> dict[str, int]:
        out = {}
        for target in targets:
            held = self.index.match(target.id, sample.keys)
            if held is not None:
                out[target.id] = (sample.positions[held - 1] + 1 if held else 0) * self.block_size
        return out

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._ctx.destroy(linger=0)
