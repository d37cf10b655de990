"""BlockPool: the paged KV cache's blocks, their reference counts, the free queue and the prefix-cache map.

Rules that fence this module in (as in vLLM v1's ``core/block_pool.py``):
- the pool only keeps blocks; it never decides which request gets what (that is the KVCacheManager);
- a block with ``ref_cnt == 0`` is in the free queue, and only such blocks are; the queue is in eviction
  order: blocks freed without a cached prefix first (most recently freed first, as vLLM >= 0.11 prepends
  them), then the rest least recently freed first, so a freed block that still holds a cached prefix lives
  on as long as possible;
- a full block that holds computed KV carries its chained hash until the pool hands it out again (eviction),
  at which point the hash is dropped. Two blocks may hold the same hash (a fully cached prompt recomputes
  its last block into a new one): as in vLLM both are cached copies, the first is the one lookups find, and
  when it is evicted the next copy takes its place;
- the cached blocks of a hash chain are a prefix of it: a request holds a whole chain and frees it tail
  first, so a block's chain parent is held, or queued behind it for eviction, for as long as the block is
  cached (lookups bisect on this; it holds as long as chained hashes do not collide, which the prefix cache
  itself assumes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol


class KVEventSink(Protocol):
    """Where the pool reports what its prefix cache gains and loses (vLLM's KV events); the pool only
    reports, the sink decides what to do with it."""

    def blocks_stored(
        self, block_hashes: list[int], parent_hash: int | None, token_ids: list[int]
    ) -> None: ...

    def blocks_removed(self, block_hashes: list[int]) -> None: ...

    def all_cleared(self) -> None: ...


class KVCacheBlock:
    """One page of KV for ``block_size`` tokens."""

    __slots__ = ("block_hash", "block_id", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class BlockPool:
    """``num_blocks`` blocks; free ones in an O(1) LRU queue, cached ones in a hash map.

    The free queue starts as every block in id order. Blocks nobody has taken yet follow the reused-first
    blocks and exist only as a count (``_fresh``, the next never-used id) until they are taken: a fleet-size
    Rank of millions of tokens costs nothing until it fills, and the eviction order is the same.
    """

    def __init__(self, num_blocks: int, events: KVEventSink | None = None) -> None:
        self.num_blocks = num_blocks
        self.events = events
        self._blocks: list[KVCacheBlock] = []  # blocks created so far, by id
        self._front: list[KVCacheBlock] = []  # freed without a hash, handed out first: the head is the last
        self._fresh = 0  # blocks [_fresh, num_blocks) were never taken: next in the free queue
        # Then the freed blocks, in eviction order (popitem(last=False) takes the least recently freed).
        self._free: OrderedDict[int, KVCacheBlock] = OrderedDict()
        self._cached: dict[int, KVCacheBlock] = {}  # hash -> the copy lookups find
        self._copies: dict[int, list[KVCacheBlock]] = {}  # hash -> further copies, oldest first (rare)
        self.num_evictions = 0
        self.changes = 0  # bumped by every call that changes blocks: equal counts, the same pool

    @property
    def blocks(self) -> list[KVCacheBlock]:
        """Every block by id (creates the never-used ones; for tests and diagnostics)."""
        self._create(self.num_blocks)
        return self._blocks

    def _create(self, upto: int) -> None:
        blocks = self._blocks
        blocks.extend(KVCacheBlock(i) for i in range(len(blocks), upto))

    @property
    def num_free_blocks(self) -> int:
        """Blocks with no user, including those that still hold a reusable cached prefix."""
        return len(self._front) + self.num_blocks - self._fresh + len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def usage(self, taken: int = 0) -> float:
        """vLLM's ``kv_cache_usage_perc``: the fraction of blocks some request holds (cached-free is free),
        once ``taken`` more free blocks are handed out."""
        return 1.0 - (self.num_free_blocks - taken) / self.num_blocks

    @property
    def cached_map(self) -> Mapping[int, KVCacheBlock]:
        """Read-only view of hash → cached block (lookups on the admission hot path)."""
        return self._cached

    def get_cached_block(self, block_hash: int) -> KVCacheBlock | None:
        return self._cached.get(block_hash)

    def free_queue_ids(self) -> list[int]:
        """Block ids in eviction order (for tests and diagnostics)."""
        front = [b.block_id for b in reversed(self._front)]
        return [*front, *range(self._fresh, self.num_blocks), *self._free]

    def free_before(self, keep: set[int], upto: int) -> int:
        """How many blocks the free queue hands out (up to ``upto``) before one whose id is in ``keep``."""
        # reused-first and never-used blocks hold nothing anyone keeps
        n = min(upto, len(self._front) + self.num_blocks - self._fresh)
        if n < upto:
            for block_id in self._free:
                if block_id in keep or n >= upto:
                    break
                n += 1
        return n

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Take ``n`` blocks from the head of the free queue, evicting whatever prefix they cached."""
        self.changes += 1
        if n > self.num_free_blocks:
            raise ValueError(f"cannot get {n} free blocks; only {self.num_free_blocks} are free")
        out: list[KVCacheBlock] = []
        front = self._front
        while front and n:
            block = front.pop()
            block.ref_cnt = 1
            out.append(block)
            n -= 1
        fresh = min(n, self.num_blocks - self._fresh)
        if fresh:
            start = self._fresh
            self._fresh += fresh
            self._create(self._fresh)
            taken = self._blocks[start : self._fresh]
            for block in taken:
                block.ref_cnt = 1
            out += taken
            n -= fresh
        popitem = self._free.popitem
        cached = self._cached
        copies = self._copies
        evicted: list[int] = []
        taken = [popitem(last=False)[1] for _ in range(n)]
        for block in taken:
            block.ref_cnt = 1
            h = block.block_hash
            if h is not None:
                if copies:
                    self._uncache(block, h, cached)
                else:  # no hash has a second copy: this block is the one lookups find
                    del cached[h]
                block.block_hash = None
                evicted.append(h)
        self.num_evictions += len(evicted)
        out += taken
        if evicted and self.events is not None:
            self.events.blocks_removed(evicted)
        return out

    def _uncache(self, block: KVCacheBlock, h: int, cached: dict[int, KVCacheBlock]) -> None:
        """Drop ``block``'s copy of ``h``; the next copy, if any, becomes the one lookups find."""
        copies = self._copies.get(h)
        if cached.get(h) is block:
            if copies:
                cached[h] = copies.pop(0)
            else:
                del cached[h]
        elif copies is not None:
            copies.remove(block)
        if copies is not None and not copies:
            del self._copies[h]

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """A request reuses cached blocks: take a reference, and pull free ones out of the eviction queue."""
        self.changes += 1
        free = self._free
        for block in blocks:
            if block.ref_cnt == 0:
                del free[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, blocks_in_eviction_order: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block; those that reach zero join the free queue: with a cached
        prefix at its tail, without one (nothing to keep) at its head, in the order given."""
        self.changes += 1
        free = self._free
        uncached: list[KVCacheBlock] = []
        for block in blocks_in_eviction_order:
            ref = block.ref_cnt
            if ref == 1:
                block.ref_cnt = 0
                if block.block_hash is None:
                    uncached.append(block)
                else:
                    free[block.block_id] = block
            elif ref > 1:
                block.ref_cnt = ref - 1
            else:
                raise AssertionError(f"{block!r} freed more often than it was taken")
        if uncached:
            self._front += reversed(uncached)

    def cache_full_blocks(
        self,
        blocks: Sequence[KVCacheBlock],
        block_hashes: Sequence[int],
        start: int,
        end: int,
        token_ids: Callable[[int], list[int]] | None = None,
    ) -> None:
        """Register ``blocks[start:end]`` (now full of computed tokens) under their chained hashes.

        If another block already holds the same hash (a recomputed last block, or two requests that computed
        the same prefix in the same step), this one becomes a further copy: the first stays the one lookups
        find. The event sink hears of every run of newly registered blocks, copies included (vLLM reports
        them too), with its parent's hash and (``token_ids(i)`` of block ``i``) its tokens.
        """
        self.changes += 1
        cached = self._cached
        registered: list[int] = []
        for i in range(start, end):
            block = blocks[i]
            if block.block_hash is None:
                h = block_hashes[i]
                block.block_hash = h
                if h in cached:
                    self._copies.setdefault(h, []).append(block)
                else:
                    cached[h] = block
                registered.append(i)
        if registered and self.events is not None:
            self._report_stored(registered, block_hashes, token_ids)

    def _report_stored(
        self, indexes: list[int], block_hashes: Sequence[int], token_ids: Callable[[int], list[int]] | None
    ) -> None:
        """One BlockStored per contiguous run of ``indexes`` (a chain: each block's parent precedes it)."""
        assert self.events is not None
        cuts = [k for k in range(1, len(indexes)) if indexes[k] != indexes[k - 1] + 1]
        for lo, hi in zip([0, *cuts], [*cuts, len(indexes)], strict=True):
            run = indexes[lo:hi]
            tokens = [t for i in run for t in token_ids(i)] if token_ids is not None else []
            parent = block_hashes[run[0] - 1] if run[0] > 0 else None
            self.events.blocks_stored([block_hashes[i] for i in run], parent, tokens)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (vLLM's ``reset_prefix_cache``); refused (False, nothing changes)
        while any request holds a block."""
        if self.num_free_blocks != self.num_blocks:
            return False
        self.changes += 1
        for block in self._cached.values():
            block.block_hash = None
        for copies in self._copies.values():
            for block in copies:
                block.block_hash = None
        self._cached.clear()
        self._copies.clear()
        if self.events is not None:
            self.events.all_cleared()
        return True
