"""Deterministic prompts from block hash ids.

A block's tokens are drawn from a generator seeded by (salt, scope, block id), where the scope is the task
for task-private blocks and ``shared`` for the trace's global ``shared_hash_ids``: equal ids inside a task, or
shared ids anywhere, give equal tokens (a real shared prefix); nothing else can collide. Token ids stay in
``[FIRST_TOKEN_ID, vocab_size)`` so any tokenizer with that vocabulary accepts them. Text prompts spell each
token as one word (``t<id>``), which the engine emulator's tokenizer maps to one token each.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable

import numpy as np
import numpy.typing as npt

from progrouter.engine.request import chain_hashes
from progrouter.workload.trace import Trace, TraceRequest

FIRST_TOKEN_ID = 100
SHARED_SCOPE = "shared"

Tokens = npt.NDArray[np.int64]


class PromptBuilder:
    """Builds prompts for one trace; caches block tokens per task (drop them with ``forget``)."""

    def __init__(self, trace: Trace, *, salt: str = "progrouter", vocab_size: int = 32_000) -> None:
        if vocab_size <= FIRST_TOKEN_ID + 1:
            raise ValueError(f"vocab_size must be > {FIRST_TOKEN_ID + 1}")
        self._block_size = trace.block_size
        self._shared = trace.shared_hash_ids
        self._salt = salt
        self._vocab = vocab_size
        self._cache: dict[str, dict[int, Tokens]] = {}
        # Per Program: the trace ids its last prompt's whole blocks cover, and their chained hashes.
        self._chains: dict[str, tuple[tuple[int, ...], list[int]]] = {}

    def _draw(self, scope: str, key: str) -> Tokens:
        digest = hashlib.blake2b(f"{self._salt}|{scope}|{key}".encode(), digest_size=8).digest()
        rng = np.random.default_rng(int.from_bytes(digest, "little"))
        return rng.integers(FIRST_TOKEN_ID, self._vocab, self._block_size, dtype=np.int64)

    def block(self, task_id: str, block_id: int) -> Tokens:
        scope = SHARED_SCOPE if block_id in self._shared else task_id
        per_scope = self._cache.setdefault(scope, {})
        tokens = per_scope.get(block_id)
        if tokens is None:
            tokens = per_scope[block_id] = self._draw(scope, str(block_id))
        return tokens

    def token_ids(self, task_id: str, request_id: str, request: TraceRequest) -> Tokens:
        """The prompt's token ids: its blocks in order, cut or padded (with request-unique tokens) to size."""
        parts = [self.block(task_id, b) for b in request.hash_ids]
        have = len(parts) * self._block_size
        while have < request.input_tokens:
            parts.append(self._draw(f"pad:{task_id}", f"{request_id}:{have}"))
            have += self._block_size
        if not parts:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate(parts)[: request.input_tokens]

    def block_keys(
        self, task_id: str, request_id: str, request: TraceRequest, block_size: int, start: int = 0
    ) -> list[Hashable] | None:
        """One key per full ``block_size``-token block of the prompt ``token_ids`` builds, from block
        ``start`` on, equal exactly where its tokens are equal (a trace block's scope and id; request-unique
        for padding); None when ``block_size`` is not a multiple of the trace's block size."""
        per, rest = divmod(block_size, self._block_size)
        if rest:
            return None
        ids = request.hash_ids
        shared = self._shared
        full = request.input_tokens // block_size
        covered = min(full, len(ids) // per)
        keys: list[Hashable]
        if per == 1:
            keys = [(SHARED_SCOPE if b in shared else task_id, b) for b in ids[start:covered]]
        else:
            keys = [
                tuple((SHARED_SCOPE if b in shared else task_id, b) for b in ids[j * per : (j + 1) * per])
                for j in range(start, covered)
            ]
        keys.extend(("pad", task_id, request_id, j) for j in range(max(start, covered), full))
        return keys

    def block_hashes(
        self, program_id: str, task_id: str, request_id: str, request: TraceRequest, block_size: int
    ) -> list[int] | None:
        """``chain_hashes`` of ``block_keys``, reusing the Program's previous prompt's chain for the blocks
        both share (a turn extends the last one: only its new blocks are hashed); None as ``block_keys``."""
        per = block_size // self._block_size
        prev_ids, prev_hashes = self._chains.get(program_id, ((), []))
        same = len(prev_hashes)
        if request.hash_ids[: len(prev_ids)] != prev_ids:
            same = 0
        same = min(same, request.input_tokens // block_size)
        keys = self.block_keys(task_id, request_id, request, block_size, start=same)
        if keys is None:
            return None
        hashes = prev_hashes[:same] + chain_hashes(keys, prev_hashes[same - 1] if same else 0)
        covered = min(request.input_tokens // block_size, len(request.hash_ids) // per)
        self._chains[program_id] = (request.hash_ids[: covered * per], hashes[:covered])
        return hashes

    def text(self, task_id: str, request_id: str, request: TraceRequest) -> str:
        return " ".join(f"t{t}" for t in self.token_ids(task_id, request_id, request).tolist())

    def forget(self, task_id: str) -> None:
        """Drop a finished task's cached blocks (shared blocks stay)."""
        self._cache.pop(task_id, None)
        self._cache.pop(f"pad:{task_id}", None)
