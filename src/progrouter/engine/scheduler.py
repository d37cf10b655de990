"""EngineScheduler: continuous batching with chunked prefill, FCFS admission and preemption by recompute.

Each step (vLLM v1's ``Scheduler.schedule``, FCFS policy, no speculative decoding):
1. Running requests first, in admission order: each gets the tokens it still needs (1 when decoding, the
   rest of its prompt when prefilling), capped by what is left of ``max_num_batched_tokens``. When the KV
   cache cannot hold them, the *newest* running request is preempted — its blocks are freed, its progress is
   discarded (recompute) and it goes back to the front of the waiting queue — until the request fits or is
   itself the one preempted.
2. Then, only if nobody was preempted in this step, waiting requests in arrival order while there is token
   budget and fewer than ``max_num_seqs`` run: each reuses its longest cached prefix and gets a first chunk.
   The first one that does not fit stops admission (FCFS: nobody overtakes it).
The scheduler never touches blocks itself; it asks the KVCacheManager.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from progrouter.engine.kv_cache_manager import KVCacheManager
from progrouter.engine.request import Request, RequestStatus
from progrouter.engine.stats import EngineStats


class ScheduledChunk:
    """``num_tokens`` tokens of ``request`` computed this step, starting at ``start``."""

    __slots__ = ("num_tokens", "request", "start")

    def __init__(self, request: Request, start: int, num_tokens: int) -> None:
        self.request = request
        self.start = start
        self.num_tokens = num_tokens


class EngineScheduler:
    def __init__(
        self, kv: KVCacheManager, stats: EngineStats, *, max_num_seqs: int, max_num_batched_tokens: int
    ) -> None:
        self.kv = kv
        self.stats = stats
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # The waiting head that failed admission: (request, its hit blocks, blocks it needed, token budget).
        self._blocked: tuple[Request, int, int, int] | None = None
        # A head found blocked: (request, token budget, ``pool.changes`` then, the ids of its hit blocks).
        self._keep: tuple[Request, int, int, set[int]] | None = None
        self.admission_memo = True
        #: told of each preemption before the request's progress is discarded (a diagnostic's window: the
        #: compiled class cannot have its methods replaced)
        self.on_preempt: Callable[[Request], None] | None = None

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def remove(self, request: Request) -> None:
        """Take a request out of whichever queue holds it and give its blocks back."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self.kv.free(request)

    def finish(self, request: Request) -> None:
        """A running request finished in this step."""
        self.running.remove(request)
        self.kv.free(request)

    def schedule(self, now: float) -> list[ScheduledChunk]:
        kv = self.kv
        budget = self.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        running = self.running
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            while not kv.allocate_slots(request, n):
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is request:
                    break
            else:
                chunks.append(ScheduledChunk(request, request.num_computed_tokens, n))
                request.num_computed_tokens += n
                budget -= n
                i += 1
                continue
            break
        if not preempted:
            self._admit(now, budget, chunks)
        return chunks

    def _admit(self, now: float, budget: int, chunks: list[ScheduledChunk]) -> None:
        kv = self.kv
        waiting = self.waiting
        running = self.running
        stats = self.stats
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            request = waiting[0]
            if request.arrival_time > now:
                break
            if self._still_blocked(request, budget):
                break
            hits, num_hit_tokens = kv.get_computed_blocks(request)
            n = min(request.num_tokens - num_hit_tokens, budget)
            if not kv.allocate_slots(request, n, hits):
                self._blocked = (request, len(hits), -(-n // kv.block_size), budget)
                self._keep = (request, budget, kv.pool.changes, {b.block_id for b in hits})
                break
            self._blocked = None
            waiting.popleft()
            running.append(request)
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit_tokens
                stats.prefix_cache_queries += request.num_tokens
                stats.prefix_cache_hits += num_hit_tokens
            request.status = RequestStatus.RUNNING
            request.prefill_base = num_hit_tokens
            request.prefill_end = request.num_tokens
            chunks.append(ScheduledChunk(request, num_hit_tokens, n))
            request.num_computed_tokens = num_hit_tokens + n
            budget -= n

    def plain_run(self, now: float, eos_probability: float) -> tuple[int, int]:
        """``(k, chunk)``: the next k schedules from ``now`` on only decode and prefill, with no admission,
        preemption, first token or finish; the last running request prefills ``chunk`` tokens in each (0:
        every request decodes).

        True of k steps when every running request but the last decodes one token; the last decodes too or
        prefills with the rest of the token budget without finishing its prompt; every request is a
        block-mode prompt whose output nobody reads, with no EOS roll; no decoding request finishes; every
        block the k steps take is free now (nobody is preempted); and no waiting request can be admitted:
        the prefill takes the whole budget, none waits, the batch is full, or the head's admission fails
        now and keeps failing (fewer blocks free, none of the blocks it would reuse evicted, and the blocks
        cached meanwhile are other requests' outputs).
        ``(0, 0)`` when the next step is not such a step.
        """
        running = self.running
        if not running:
            return 0, 0
        last = running[-1]
        left = last.num_tokens - last.num_computed_tokens
        budget = self.max_num_batched_tokens
        chunk = budget - (len(running) - 1) if left > 1 else 0
        if (left > 1 and chunk <= 0) or (left <= 1 and len(running) > budget):
            return 0, 0
        steps = (left - 1) // chunk if chunk else 1 << 30  # a prefill's steps that leave a token: no sampling
        eos = eos_probability > 0.0
        if last.tokens_kept or (eos and not last.params.ignore_eos):
            return 0, 0
        for r in running[:-1] if chunk else running:
            if (
                r.tokens_kept
                or (eos and not r.params.ignore_eos)
                or r.num_tokens - r.num_computed_tokens != 1
            ):
                return 0, 0
            steps = min(steps, r.params.max_tokens - r.num_output_tokens - 1)
            if steps <= 0:  # the next step samples a finish (the usual case): stop looking
                return 0, 0
        if steps <= 0:  # the next step samples the prefill's first token
            return 0, 0
        free = self.kv.pool.num_free_blocks
        if not chunk and self.waiting and len(running) < self.max_num_seqs:
            keep = self._blocked_head(now, budget - len(running))
            if keep is None:
                return 0, 0
            free = self.kv.pool.free_before(keep, free)  # the run must not evict what the head would reuse
        growth, bs = self._growth(chunk), self.kv.block_size
        if _blocks_taken(growth, steps, bs) > free:  # the longest run whose blocks are all free now
            lo, hi = 0, steps
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if _blocks_taken(growth, mid, bs) <= free else (lo, mid - 1)
            steps = lo
        return (steps, chunk) if steps > 0 else (0, 0)

    def admits_during_run(self, chunk: int) -> bool:
        """Whether a request that arrives during a plain run (``chunk`` as ``plain_run`` gave it) could be
        admitted before the run ends: only if nothing but decodes run, the batch has room and none waits
        (a waiting head that keeps failing admission keeps every later arrival out: FCFS)."""
        return not chunk and not self.waiting and len(self.running) < self.max_num_seqs

    def _blocked_head(self, now: float, budget: int) -> set[int] | None:
        """The ids of the cached blocks the waiting head would reuse, if its admission fails now (as
        ``_admit`` would find); None if it could be admitted or has not arrived. With those blocks left in
        place, fewer free blocks and other requests' outputs cached, it keeps failing."""
        head = self.waiting[0]
        if head.arrival_time > now:
            return None
        kv = self.kv
        memo = self._keep
        if memo is not None and memo[0] is head and memo[1] == budget and memo[2] == kv.pool.changes:
            return memo[3]  # found blocked on this very pool (usually by this step's admission)
        hits, num_hit_tokens = kv.get_computed_blocks(head)
        n = min(head.num_tokens - num_hit_tokens, budget)
        if kv.blocks_needed(head, n, hits) is not None:
            return None
        keep = {b.block_id for b in hits}
        self._keep = (head, budget, kv.pool.changes, keep)
        return keep

    def new_blocks(self, steps: int, chunk: int) -> int:
        """Blocks ``steps`` plain schedules take: every decoder's position ``c + i``, the prefill's chunks."""
        return _blocks_taken(self._growth(chunk), steps, self.kv.block_size)

    def _growth(self, chunk: int) -> list[tuple[int, int, int]]:
        """Per running request in a plain run: computed tokens, tokens a step (``chunk`` for the prefill, 1
        for a decoder) and blocks held."""
        kv = self.kv
        running = self.running
        last = running[-1] if chunk else None
        return [(r.num_computed_tokens, chunk if r is last else 1, kv.num_blocks_of(r)) for r in running]

    def advance_plain(self, steps: int, chunk: int) -> None:
        """Apply ``steps`` schedules ``plain_run`` allowed, with every block taken and cached in the order
        stepping would: step by step, running order. A decoder only reaches the KV manager at the steps that
        start a block (a new block) or fill one (it gets cached); in between it just counts."""
        kv = self.kv
        bs = kv.block_size
        running = self.running
        decoders = running[:-1] if chunk else running
        events: list[tuple[int, int]] = []  # (step, running index)
        for index, r in enumerate(decoders):
            c = r.num_computed_tokens
            for first in ((-c) % bs, (bs - 1 - c) % bs):  # position c + i starts a block / fills one
                events.extend((i, index) for i in range(first, steps, bs))
        if chunk:
            events.extend((i, len(running) - 1) for i in range(steps))
        events.sort()
        start = [r.num_computed_tokens for r in running]
        for i, index in events:
            r = running[index]
            n = chunk if chunk and index == len(running) - 1 else 1
            at = start[index] + i * n
            if n == 1:
                r.skip_output_tokens(at - r.num_computed_tokens)
            r.num_computed_tokens = at
            if not kv.allocate_slots(r, n):
                raise AssertionError("a planned step found no free blocks")
        for index, r in enumerate(running):
            n = chunk if chunk and index == len(running) - 1 else 1
            end = start[index] + steps * n
            if n == 1:
                r.skip_output_tokens(end - r.num_computed_tokens)
            r.num_computed_tokens = end

    def _still_blocked(self, request: Request, budget: int) -> bool:
        """True when the head that failed last time must fail again, so its cache lookup can be skipped.

        Sound, not heuristic: the blocks a head needs, ``ceil(min(uncached, budget) / block_size)``, can only
        shrink if its cached prefix grows (the block after its old hits got cached) or the budget shrinks;
        and it can never get more than the free blocks. So if neither happened and fewer blocks are free
        than it needed last time, admission fails again.
        """
        blocked = self._blocked
        if blocked is None or blocked[0] is not request or not self.admission_memo:
            return False
        _, hit_blocks, needed, old_budget = blocked
        if budget < old_budget or self.kv.pool.num_free_blocks >= needed:
            return False
        hashes = request.block_hashes
        max_blocks = (request.num_tokens - 1) // self.kv.block_size
        return hit_blocks >= min(max_blocks, len(hashes)) or hashes[hit_blocks] not in self.kv.pool.cached_map

    def _preempt(self, request: Request) -> None:
        if self.on_preempt is not None:
            self.on_preempt(request)
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.waiting.appendleft(request)


def _blocks_taken(growth: list[tuple[int, int, int]], steps: int, block_size: int) -> int:
    """Blocks ``steps`` plain steps take from the pool, ``growth`` as ``EngineScheduler._growth`` gives it."""
    return sum(max(0, -(-(c + steps * t) // block_size) - held) for c, t, held in growth)
