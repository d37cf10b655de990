"""KVCacheManager: decides what KV a request gets — its cached prefix, new blocks, and when they go back.

As in vLLM v1, the manager owns the request → blocks table and talks to the BlockPool; the scheduler only asks
"how much of this request is cached?" and "can it have room for n more tokens?".
"""

from __future__ import annotations

from operator import attrgetter

from progrouter.engine.block_pool import BlockPool, KVCacheBlock, KVEventSink
from progrouter.engine.request import Request

_REF_CNT = attrgetter("ref_cnt")


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, events: KVEventSink | None = None) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, events)
        self._req_blocks: dict[str, list[KVCacheBlock]] = {}
        self._num_cached_blocks: dict[str, int] = {}

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of whole blocks, and its length in tokens.

        Like vLLM, at least one token is always left to compute (its logits give the next token), so a
        prompt that is entirely cached reuses all but its last block.

        The cached blocks of a chain are always a prefix of it (``BlockPool``: a block's chain parent stays
        cached at least as long as the block), so the prefix's length is found by bisection — a few lookups
        instead of one per block of a 100k-token prompt — and its blocks are then fetched in one C loop.
        """
        hashes = request.block_hashes
        cached = self.pool.cached_map
        lo, hi = 0, min((request.num_tokens - 1) // self.block_size, len(hashes))
        while lo < hi:  # the first lo hashes are cached; hashes[hi] is not (or hi is the limit)
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in cached:
                lo = mid
            else:
                hi = mid - 1
        hits = list(map(cached.__getitem__, hashes[:lo]))
        return hits, lo * self.block_size

    def allocate_slots(
        self, request: Request, num_new_tokens: int, new_computed_blocks: list[KVCacheBlock] | None = None
    ) -> bool:
        """Give ``request`` room for ``num_new_tokens`` more computed tokens (after any cache hits).

        Returns False, changing nothing, when the pool cannot supply the blocks even by evicting every
        unreferenced cached block. Blocks that become full are registered in the prefix cache right away,
        so a request scheduled later in the same step can already hit them (vLLM does the same).
        """
        bs = self.block_size
        c = request.num_computed_tokens
        if num_new_tokens == 1 and new_computed_blocks is None and c % bs and (c + 1) % bs:
            return True  # a token inside a block it holds that does not fill it: nothing changes
        num_new_blocks = self.blocks_needed(request, num_new_tokens, new_computed_blocks)
        if num_new_blocks is None:
            return False
        rid = request.request_id
        blocks = self._req_blocks.get(rid)
        hits = new_computed_blocks or []
        total = request.num_computed_tokens + len(hits) * bs + num_new_tokens
        pool = self.pool
        if blocks is None:
            blocks = self._req_blocks[rid] = []
            self._num_cached_blocks[rid] = 0
        if hits:
            pool.touch(hits)
            blocks.extend(hits)
            self._num_cached_blocks[rid] = len(blocks)
        if num_new_blocks > 0:
            blocks.extend(pool.get_new_blocks(num_new_blocks))
        num_full = min(total, request.num_tokens) // bs
        done = self._num_cached_blocks[rid]
        if num_full > done:
            pool.cache_full_blocks(blocks, request.block_hashes, done, num_full, request.block_token_ids)
            self._num_cached_blocks[rid] = num_full
        return True

    def blocks_needed(
        self, request: Request, num_new_tokens: int, new_computed_blocks: list[KVCacheBlock] | None = None
    ) -> int | None:
        """New blocks ``allocate_slots`` would take for these tokens, or None when the pool cannot supply
        them (cached hits waiting in the free queue cannot also serve as new blocks)."""
        bs = self.block_size
        blocks = self._req_blocks.get(request.request_id)
        hits = new_computed_blocks or []
        total = request.num_computed_tokens + len(hits) * bs + num_new_tokens
        num_new_blocks = -(-total // bs) - (len(blocks) if blocks is not None else 0) - len(hits)
        if num_new_blocks > 0 or hits:
            short = num_new_blocks - self.pool.num_free_blocks
            # Count the hits waiting in the free queue only when it matters (each is a block fewer).
            if short > -len(hits) and short > -list(map(_REF_CNT, hits)).count(0):
                return None
        return num_new_blocks

    def free(self, request: Request) -> None:
        """Return a request's blocks, tail first, so its last blocks are evicted before its shared prefix."""
        blocks = self._req_blocks.pop(request.request_id, None)
        self._num_cached_blocks.pop(request.request_id, None)
        if blocks:
            self.pool.free_blocks(reversed(blocks))

    def num_blocks_of(self, request: Request) -> int:
        return len(self._req_blocks.get(request.request_id, ()))

    @property
    def num_requests(self) -> int:
        return len(self._req_blocks)
