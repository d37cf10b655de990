"""One generation request as the engine core sees it: token ids, progress, its slice of the prefix cache.

Block hashes are chained (a block's hash covers its parent's hash and its own token ids), exactly as vLLM v1's
automatic prefix caching keys full blocks, so two requests share a cached block only if they share the whole
prefix up to and including it.

A prompt is either token ids or ``PromptBlocks``: its length and the chained hashes of its full blocks made
by ``chain_hashes`` from one key per block standing for that block's tokens (equal keys, equal tokens), for a
simulator that knows the prefix structure and would only spend time drawing tokens and hashing them. Such a
request keeps no token ids at all: its tokens are counted, its output blocks get request-unique keys (an
output never matches another request's, as sampled tokens would not), and the cache behaves as it would for
the tokens the keys stand for.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Hashable, Iterable, Sequence
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


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """``num_tokens`` tokens given by the chained hashes of their full blocks (``num_tokens // block_size``
    of them, as ``chain_hashes`` makes them from the blocks' keys; no cache salt)."""

    num_tokens: int
    block_hashes: Sequence[int]


def chain_hashes(keys: Iterable[Hashable], parent: int = 0) -> list[int]:
    """Block hashes chained from ``parent`` (0: the unsalted root): each covers its parent and its key."""
    out = []
    for key in keys:
        parent = hash((parent, key))
        out.append(parent)
    return out


def root_block_hash(cache_salt: str | None) -> int:
    """The parent hash of a request's first block; a cache salt gives it a private cache namespace."""
    return 0 if cache_salt is None else zlib.crc32(cache_salt.encode()) + 1


class Request:
    """Mutable engine-side state of one request; owned by the EngineCore and its scheduler."""

    __slots__ = (
        "_open",
        "_rng",
        "_tokens",
        "arrival_time",
        "block_hashes",
        "block_size",
        "finish_reason",
        "first_token_time",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_output_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "num_tokens",
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
        prompt: Sequence[int] | PromptBlocks,
        params: SamplingParams,
        *,
        arrival_time: float,
        block_size: int,
        token_seed: int,
        vocab_size: int = 32000,
        cache_salt: str | None = None,
    ) -> None:
        self.request_id = request_id
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
        self.num_output_tokens = 0
        self.first_token_time: float | None = None
        self.finish_reason: FinishReason | None = None
        self._rng: random.Random | None = None
        self.block_hashes: list[int] = []
        self.root_hash = parent = root_block_hash(cache_salt)
        hashes = self.block_hashes
        if isinstance(prompt, PromptBlocks):
            self.num_prompt_tokens = prompt.num_tokens
            self._open: list[int] | None = None  # block mode: no tokens kept
            self._tokens: list[int] | None = None
            hashes.extend(prompt.block_hashes)
        else:
            tokens = list(prompt)
            self.num_prompt_tokens = len(tokens)
            full = len(tokens) - len(tokens) % block_size
            blocks = (tuple(tokens[start : start + block_size]) for start in range(0, full, block_size))
            hashes.extend(chain_hashes(blocks, parent))
            self._open = tokens[full:]  # the tokens of the block being filled
            self._tokens = tokens  # every token so far (prompt and output), for the KV events' token ids
        self.num_tokens = self.num_prompt_tokens

    def append_output_token(self, eos_probability: float) -> int:
        """Sample the next token (deterministic in ``token_seed`` and position); extend the block hashes."""
        n_out = self.num_output_tokens
        params = self.params
        if eos_probability > 0.0 and not params.ignore_eos and n_out >= params.min_tokens:
            if self._rng is None:
                self._rng = random.Random(self.token_seed)
            token = EOS_TOKEN_ID if self._rng.random() < eos_probability else self._token_at(n_out)
        else:
            token = self._token_at(n_out)
        self.num_output_tokens = n_out + 1
        self.num_tokens += 1
        opened, tokens = self._open, self._tokens
        if opened is None or tokens is None:
            if self.num_tokens % self.block_size == 0:
                self._close_block((self.request_id, self.num_tokens))
            return token
        opened.append(token)
        tokens.append(token)
        if len(opened) == self.block_size:
            self._close_block(tuple(opened))
            self._open = []
        return token

    def count_unread_token(self, eos_probability: float) -> bool:
        """For a block-mode request past its first token whose next token cannot end it (no EOS roll, not
        its last): count that token without drawing it, as ``skip_output_tokens(1)`` (nobody reads it).
        False, changing nothing, for any other request: draw it with ``append_output_token``."""
        params = self.params
        if (
            self._open is not None
            or self.first_token_time is None
            or (eos_probability > 0.0 and not params.ignore_eos)
            or self.num_output_tokens + 1 >= params.max_tokens
        ):
            return False
        self.skip_output_tokens(1)
        return True

    def skip_output_tokens(self, n: int) -> None:
        """Count ``n`` more output tokens without drawing them (block-mode prompts, whose tokens nobody
        reads); full output blocks get their request-unique keys as ``append_output_token`` gives them."""
        bs = self.block_size
        start = self.num_tokens
        self.num_output_tokens += n
        self.num_tokens += n
        for end in range(start - start % bs + bs, self.num_tokens + 1, bs):
            self._close_block((self.request_id, end))

    def _close_block(self, key: Hashable) -> None:
        hashes = self.block_hashes
        hashes.extend(chain_hashes((key,), hashes[-1] if hashes else self.root_hash))

    def block_token_ids(self, index: int) -> list[int]:
        """The token ids of full block ``index`` (empty for a block-mode prompt, whose tokens never exist)."""
        tokens = self._tokens
        if tokens is None:
            return []
        bs = self.block_size
        return tokens[index * bs : (index + 1) * bs]

    @property
    def tokens_kept(self) -> bool:
        """False for a block-mode prompt: its tokens are counted, never drawn."""
        return self._open is not None

    def _token_at(self, position: int) -> int:
        mixed = ((self.token_seed + position * 0x9E3779B1) * 0x85EBCA6B) & 0xFFFFFFFF
        return FIRST_WORD_TOKEN_ID + (mixed >> 3) % self.token_span

    def finished_by_token(self, token: int) -> FinishReason | None:
        if token == EOS_TOKEN_ID and not self.params.ignore_eos:
            return FinishReason.STOP
        if self.num_output_tokens >= self.params.max_tokens:
            return FinishReason.LENGTH
        return None
