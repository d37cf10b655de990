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
        self.admission_memo = True

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

    def decode_run_length(self, now: float, eos_probability: float) -> int:
        """How many schedules from ``now`` on are plain decodes that change nothing but counts.

        True of the next k steps when every running request decodes one token (all fit the token budget), is a
        block-mode prompt whose output nobody reads, has no EOS roll, neither needs a new block nor fills one
        and does not finish within them; and no waiting request can be admitted (none waits, the batch is
        full, or the head failed admission and nothing it needs can change: no block is freed, allocated or
        cached in such steps). 0 when the next step is not one of them.
        """
        running = self.running
        if not running or len(running) > self.max_num_batched_tokens:
            return 0
        waiting = self.waiting
        if waiting and len(running) < self.max_num_seqs:
            head = waiting[0]
            budget = self.max_num_batched_tokens - len(running)
            if head.arrival_time > now or not self._still_blocked(head, budget):
                return 0
        kv = self.kv
        bs = kv.block_size
        steps = 1 << 30
        for r in running:
            c = r.num_computed_tokens
            if r.num_tokens - c != 1 or r.tokens_kept or (eos_probability > 0.0 and not r.params.ignore_eos):
                return 0
            # Step i computes position c + i: stop before the one that fills a block or needs a new one.
            room = min((c // bs + 1) * bs - c - 1, kv.num_blocks_of(r) * bs - c)
            steps = min(steps, room, r.params.max_tokens - r.num_output_tokens - 1)
            if steps <= 0:
                return 0
        return steps

    def advance_decodes(self, steps: int) -> None:
        """Apply ``steps`` plain decode steps (``decode_run_length`` allowed them) to the running requests."""
        for r in self.running:
            r.num_computed_tokens += steps
            r.skip_output_tokens(steps)

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
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.waiting.appendleft(request)
