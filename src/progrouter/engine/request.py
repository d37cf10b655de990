"""One generation request as the engine core sees it: token ids, progress, its slice of the prefix cache.

Block hashes are chained (a block's hash covers its parent's hash and its own token ids), exactly as vLLM v1's
automatic prefix caching keys full blocks, so two requests share a cached block only if they share the whole
prefix up to and including it.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from enum import StrEnum

PAD_TOKEN_ID = 0
BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2
FIRST_WORD_TOKEN_ID = 3


class RequestStatus(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class FinishReason(StrEnum):
    LENGTH = "length"
    STOP = "stop"
    ABORT = "abort"


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """The output is ``max_tokens`` tokens unless an EOS roll (``ignore_eos`` false) ends it early."""

    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    seed: int | None = None


def root_block_hash(cache_salt: str | None) -> int:
    """The parent hash of a request's first block; a cache salt gives it a private cache namespace."""
    return 0 if cache_salt is None else zlib.crc32(cache_salt.encode()) + 1


class Request:
    """Mutable engine-side state of one request; owned by the EngineCore and its scheduler."""

    __slots__ = (
        "_rng",
        "all_token_ids",
        "arrival_time",
        "block_hashes",
        "block_size",
        "finish_reason",
        "first_token_time",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "params",
        "prefill_base",
        "prefill_end",
        "request_id",
        "root_hash",
        "status",
        "token_seed",
        "token_span",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        arrival_time: float,
        block_size: int,
        token_seed: int,
        vocab_size: int = 32000,
        cache_salt: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.all_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.arrival_time = arrival_time
        self.block_size = block_size
        self.token_seed = token_seed
        self.token_span = vocab_size - FIRST_WORD_TOKEN_ID
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        # -1 until first scheduled; then the prompt tokens served from the prefix cache (usage.cached_tokens).
        self.num_cached_tokens = -1
        self.prefill_base = 0  # num_computed_tokens when (re)admitted: where the uncached prefill starts
        self.prefill_end = 0  # num_tokens when (re)admitted: where the prefill ends and decoding begins
        self.num_preemptions = 0
        self.first_token_time: float | None = None
        self.finish_reason: FinishReason | None = None
        self._rng: random.Random | None = None
        self.block_hashes: list[int] = []
        self.root_hash = parent = root_block_hash(cache_salt)
        tokens = self.all_token_ids
        for start in range(0, len(tokens) - block_size + 1, block_size):
            parent = hash((parent, tuple(tokens[start : start + block_size])))
            self.block_hashes.append(parent)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens :]

    def append_output_token(self, eos_probability: float) -> int:
        """Sample the next token (deterministic in ``token_seed`` and position); extend the block hashes."""
        n_out = len(self.all_token_ids) - self.num_prompt_tokens
        params = self.params
        if eos_probability > 0.0 and not params.ignore_eos and n_out >= params.min_tokens:
            if self._rng is None:
                self._rng = random.Random(self.token_seed)
            token = EOS_TOKEN_ID if self._rng.random() < eos_probability else self._token_at(n_out)
        else:
            token = self._token_at(n_out)
        tokens = self.all_token_ids
        tokens.append(token)
        bs = self.block_size
        if len(tokens) % bs == 0:
            hashes = self.block_hashes
            parent = hashes[-1] if hashes else self.root_hash
            hashes.append(hash((parent, tuple(tokens[-bs:]))))
        return token

    def _token_at(self, position: int) -> int:
        mixed = ((self.token_seed + position * 0x9E3779B1) * 0x85EBCA6B) & 0xFFFFFFFF
        return FIRST_WORD_TOKEN_ID + (mixed >> 3) % self.token_span

    def finished_by_token(self, token: int) -> FinishReason | None:
        if token == EOS_TOKEN_ID and not self.params.ignore_eos:
            return FinishReason.STOP
        if self.num_output_tokens >= self.params.max_tokens:
            return FinishReason.LENGTH
        return None
