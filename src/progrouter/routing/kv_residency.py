"""Which block chains each Rank holds, from its KV events (sans-I/O: every call takes an explicit ``now``).

The engine's block hashes are its own (vLLM seeds them), so the index keys blocks by a chain key of its own,
``hash((parent key, the block's token ids))``, computed from ``BlockStored``'s token ids: a prompt's token ids
give the same keys in the router with no call to the engine. A Rank is ``unknown`` (``match`` returns None)
until its first batch, after it is silent for ``silence_seconds``, and when an index would exceed
``max_blocks`` it forgets that Rank's oldest blocks (it then under-reports, never over-reports).
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

ROOT_KEY = 0


def chain_keys(token_ids: Sequence[int], block_size: int, parent: int = ROOT_KEY) -> list[int]:
    """The chain keys of ``token_ids``' full blocks (a prompt's, or a BlockStored's)."""
    keys = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        keys.append(parent)
    return keys


def held_prefix(keys: Sequence[int], held: Container[int]) -> int:
    """How many leading ``keys`` are in ``held``: the resident part of a prompt's chain."""
    n = 0
    for key in keys:
        if key not in held:
            break
        n += 1
    return n


class Applied(StrEnum):
    OK = "ok"
    STALE = "stale"  # already applied (a replay overlapping the live stream)
    GAP = "gap"  # batches are missing before this one: replay from ``expected_seq``, then apply it again


@dataclass
class RankResidency:
    """One Rank's resident blocks: engine hash → chain key, and how many engine blocks hold each key."""

    next_seq: int | None = None  # the sequence number expected next (None: none seen yet)
    last_heard: float | None = None
    engine_to_key: dict[int, int] = field(default_factory=dict)
    key_count: dict[int, int] = field(default_factory=dict)
    # Further copies of an engine hash (vLLM stores a recomputed block again under the same hash and removes
    # each copy on its own): the hash stays resident until its last copy is removed.
    extra_copies: dict[int, int] = field(default_factory=dict)
    gaps: int = 0
    lost: int = 0  # gaps replay could not fill (the index may miss blocks stored then)
    lag_seconds: float = 0.0

    def clear(self) -> None:
        self.engine_to_key.clear()
        self.key_count.clear()
        self.extra_copies.clear()


class ResidencyIndex:
    """Per Rank (any hashable source key, e.g. ``(worker URL, DP rank)``), the resident chains."""

    def __init__(self, *, silence_seconds: float = 30.0, max_blocks: int = 4_000_000) -> None:
        self.silence_seconds = silence_seconds
        self.max_blocks = max_blocks
        self.ranks: dict[Any, RankResidency] = {}

    def rank(self, source: Any) -> RankResidency:
        state = self.ranks.get(source)
        if state is None:
            state = self.ranks[source] = RankResidency()
        return state

    def apply(self, source: Any, seq: int, ts: float, events: list[list[Any]], now: float) -> Applied:
        """Apply one batch in sequence order; a batch after a gap is refused (GAP) until the gap is filled
        or declared lost (``skip_gap``)."""
        state = self.rank(source)
        if state.next_seq is not None:
            if seq < state.next_seq:
                return Applied.STALE
            if seq > state.next_seq:
                return Applied.GAP
        for event in events:
            self._apply_event(state, event)
        state.next_seq = seq + 1
        state.last_heard = now
        state.lag_seconds = max(0.0, now - ts)
        return Applied.OK

    def record_gap(self, source: Any) -> None:
        self.rank(source).gaps += 1

    def skip_gap(self, source: Any, seq: int) -> None:
        """Replay could not fill the gap up to ``seq``: forget the Rank's blocks (what was removed meanwhile
        is unknown) and continue from ``seq``."""
        state = self.rank(source)
        state.lost += 1
        state.clear()
        state.next_seq = seq

    def _apply_event(self, state: RankResidency, event: list[Any]) -> None:
        tag = event[0]
        if tag == "BlockStored":
            hashes, parent, tokens, block_size = event[1], event[2], event[3], event[4]
            parent_key = ROOT_KEY if parent is None else state.engine_to_key.get(parent)
            if parent_key is None or len(tokens) != len(hashes) * block_size:
                return  # its parent is not known here (or no tokens): it cannot be matched anyway
            for engine_hash, key in zip(hashes, chain_keys(tokens, block_size, parent_key), strict=True):
                if engine_hash in state.engine_to_key:
                    state.extra_copies[engine_hash] = state.extra_copies.get(engine_hash, 0) + 1
                else:
                    state.engine_to_key[engine_hash] = key
                    state.key_count[key] = state.key_count.get(key, 0) + 1
            self._bound(state)
        elif tag == "BlockRemoved":
            for engine_hash in event[1]:
                self._forget(state, engine_hash)
        elif tag == "AllBlocksCleared":
            state.clear()

    @staticmethod
    def _forget(state: RankResidency, engine_hash: int) -> None:
        copies = state.extra_copies.pop(engine_hash, 0)
        if copies > 1:
            state.extra_copies[engine_hash] = copies - 1
        if copies:
            return
        key = state.engine_to_key.pop(engine_hash, None)
        if key is not None:
            n = state.key_count[key] - 1
            if n:
                state.key_count[key] = n
            else:
                del state.key_count[key]

    def _bound(self, state: RankResidency) -> None:
        excess = len(state.engine_to_key) - self.max_blocks
        if excess > 0:
            for engine_hash in list(state.engine_to_key)[:excess]:  # the oldest stored, every copy
                state.extra_copies.pop(engine_hash, None)
                self._forget(state, engine_hash)

    def expire(self, now: float) -> None:
        """Ranks silent for ``silence_seconds`` become unknown (their blocks are forgotten)."""
        for state in self.ranks.values():
            if state.last_heard is not None and now - state.last_heard > self.silence_seconds:
                state.clear()
                state.last_heard = None
                state.next_seq = None

    def match(self, source: Any, keys: Sequence[int]) -> int | None:
        """How many leading blocks of ``keys`` (``chain_keys`` of a prompt) the Rank holds; None: unknown."""
        state = self.ranks.get(source)
        if state is None or state.last_heard is None:
            return None
        return held_prefix(keys, state.key_count)

    def size(self) -> int:
        return sum(len(s.engine_to_key) for s in self.ranks.values())
