"""Rolling per-Rank workload statistics (upstream ``factors.rs``, spec upstream-behavior §3.5).

Three bounded FIFO windows per Rank feed every automatic decision: request samples (pushed on successful
completion), continuity samples (pushed at arrival: the gap since the Program's last completion and the
cache-miss impact at that time) and TTL-pause segment rounds. A window is *complete* once it holds
``window_size`` samples; until then the policy falls back (zero TTL, zero reserve, warm-up freshness, static
force-resume timeout).

The scheduler reads these averages on hot paths (every admission plan), so every average is O(1): the
windows keep running sums, updated on push and eviction. Integer sums are exact. Float sums are re-summed
from the window once per ``window_size`` evictions, which bounds the rounding drift of add/subtract without
giving up amortised O(1).

Sans-I/O: timestamps (``finished_at``) are whatever clock the caller drives the scheduler with.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, ValuesView
from typing import NamedTuple

__all__ = ["ContinuitySample", "LogNormalFit", "RankFactors", "RequestSample"]


class RequestSample(NamedTuple):
    """One successfully completed request on a Rank (a tuple: one is made per completion)."""

    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    context_growth_tokens: int | None  # prompt − previous context, only when 0 < growth < previous
    e2e_seconds: float
    decode_seconds: float | None  # measured decode time, None when the shell could not measure it
    queue_seconds: float  # router queue (RequestPool) wait
    rounds_since_ttl_pause: int
    finished_at: float


class ContinuitySample(NamedTuple):
    """Gap from a Program's last completion to its next arrival, with the cache-miss impact then."""

    interval_seconds: float
    cache_miss_impact_seconds: float


class LogNormalFit(NamedTuple):
    """Maximum-likelihood log-normal fit: μ, σ of ln(interval) (population std, σ ≥ 1e-6). A tuple: one
    is made per continuity sample, and the fitted TTL's cache hashes it."""

    mu: float
    sigma: float
    samples: int

    @property
    def mean(self) -> float:
        """E[T] = exp(μ + σ²/2)."""
        return math.exp(self.mu + self.sigma * self.sigma / 2.0)


MIN_LOG_SIGMA = 1e-6


class RankFactors:
    """Bounded rolling windows of one Rank with O(1) averages."""

    __slots__ = (
        "_cached_sum",
        "_completion_sum",
        "_continuity",
        "_continuity_evictions",
        "_decode_count",
        "_decode_sum",
        "_e2e_sum",
        "_fit",
        "_fit_valid",
        "_growth_count",
        "_growth_sum",
        "_impact_sum",
        "_log_count",
        "_log_sq_sum",
        "_log_sum",
        "_logs",
        "_prompt_sum",
        "_queue_sum",
        "_request_evictions",
        "_requests",
        "_rounds_sum",
        "_ttl_pause_rounds",
        "_ttl_rounds_sum",
        "window_size",
    )

    def __init__(self, window_size: int) -> None:
        if window_size <= 0:
            raise ValueError("window_size must be > 0")
        self.window_size = window_size
        self._requests: deque[RequestSample] = deque()
        self._continuity: deque[ContinuitySample] = deque()
        self._logs: deque[float | None] = deque()  # ln(interval) of each continuity sample (None: unusable)
        self._ttl_pause_rounds: deque[int] = deque()
        # request window sums (ints exact, floats re-summed periodically)
        self._prompt_sum = 0
        self._completion_sum = 0
        self._cached_sum = 0
        self._growth_sum = 0
        self._growth_count = 0
        self._rounds_sum = 0
        self._e2e_sum = 0.0
        self._queue_sum = 0.0
        self._decode_sum = 0.0
        self._decode_count = 0
        self._request_evictions = 0
        # continuity window sums
        self._impact_sum = 0.0
        self._log_sum = 0.0
        self._log_sq_sum = 0.0
        self._log_count = 0
        self._continuity_evictions = 0
        self._fit: LogNormalFit | None = None
        self._fit_valid = False
        # TTL-pause window
        self._ttl_rounds_sum = 0

    # ------------------------------------------------------------------ pushes

    def push_request(self, sample: RequestSample) -> None:
        """Record a successful completion; the oldest sample drops once the window is full."""
        if len(self._requests) >= self.window_size:
            self._remove_request(self._requests.popleft())
            self._request_evictions += 1
        self._requests.append(sample)
        self._add_request(sample)
        if self._request_evictions >= self.window_size:
            self._resum_requests()

    def push_continuity(self, sample: ContinuitySample) -> None:
        """Record an arrival's gap since the Program's previous completion (the evicted sample's terms
        leave each sum before the new one's enter; written out: one is pushed per arrival)."""
        continuity, logs = self._continuity, self._logs
        if len(continuity) >= self.window_size:
            old, old_log = continuity.popleft(), logs.popleft()
            self._impact_sum -= old.cache_miss_impact_seconds
            if old_log is not None:
                self._log_sum -= old_log
                self._log_sq_sum -= old_log * old_log
                self._log_count -= 1
            self._continuity_evictions += 1
        interval = sample.interval_seconds
        log = math.log(interval) if 0.0 < interval < math.inf else None  # positive and finite (not NaN)
        continuity.append(sample)
        logs.append(log)
        self._impact_sum += sample.cache_miss_impact_seconds
        if log is not None:
            self._log_sum += log
            self._log_sq_sum += log * log
            self._log_count += 1
        if self._continuity_evictions >= self.window_size:
            self._resum_continuity()
        self._fit_valid = False

    def push_ttl_pause_rounds(self, rounds: int) -> None:
        """Record the segment rounds served between two TTL pauses."""
        if len(self._ttl_pause_rounds) >= self.window_size:
            self._ttl_rounds_sum -= self._ttl_pause_rounds.popleft()
        self._ttl_pause_rounds.append(rounds)
        self._ttl_rounds_sum += rounds

    # ------------------------------------------------------------------ windows

    @property
    def request_sample_count(self) -> int:
        return len(self._requests)

    @property
    def continuity_sample_count(self) -> int:
        return len(self._continuity)

    @property
    def ttl_pause_sample_count(self) -> int:
        return len(self._ttl_pause_rounds)

    def request_window_complete(self) -> bool:
        return len(self._requests) >= self.window_size

    def continuity_window_complete(self) -> bool:
        return len(self._continuity) >= self.window_size

    def request_samples(self) -> Iterator[RequestSample]:
        return iter(self._requests)

    def continuity_samples(self) -> Iterator[ContinuitySample]:
        return iter(self._continuity)

    def continuity_intervals(self) -> list[float]:
        """Every interval in the continuity window, oldest first (unfiltered)."""
        return [s.interval_seconds for s in self._continuity]

    def ttl_pause_rounds(self) -> list[int]:
        return list(self._ttl_pause_rounds)

    # ------------------------------------------------------------------ request averages (0 when empty)
    # (each written out: they are read on every admission plan, and a helper call costs more than the mean)

    def average_prompt_tokens(self) -> float:
        n = len(self._requests)
        return self._prompt_sum / n if n > 0 else 0.0

    def average_completion_tokens(self) -> float:
        n = len(self._requests)
        return self._completion_sum / n if n > 0 else 0.0

    def average_cached_prompt_tokens(self) -> float:
        n = len(self._requests)
        return self._cached_sum / n if n > 0 else 0.0

    def average_cached_prompt_ratio(self) -> float:
        """Token-weighted: Σcached / Σprompt (0 with no prompt tokens)."""
        return self._cached_sum / self._prompt_sum if self._prompt_sum > 0 else 0.0

    def average_uncached_prompt_tokens(self) -> float:
        return max(0.0, self.average_prompt_tokens() - self.average_cached_prompt_tokens())

    def average_context_growth_tokens(self) -> float:
        """Mean over the samples that recorded a growth (0 if none did)."""
        return self._growth_sum / self._growth_count if self._growth_count > 0 else 0.0

    def average_e2e_seconds(self) -> float:
        n = len(self._requests)
        return self._e2e_sum / n if n > 0 else 0.0

    def average_decode_seconds(self) -> float | None:
        """Mean measured decode seconds, None when no sample in the window measured it."""
        return self._decode_sum / self._decode_count if self._decode_count > 0 else None

    def average_queue_seconds(self) -> float:
        """Mean router (RequestPool) queue seconds."""
        n = len(self._requests)
        return self._queue_sum / n if n > 0 else 0.0

    def average_rounds_since_ttl_pause(self) -> float:
        n = len(self._requests)
        return self._rounds_sum / n if n > 0 else 0.0

    def request_throughput_per_second(self) -> float:
        """(n − 1) / (last.finished_at − first.finished_at); 0 when fewer than 2 samples or no time span."""
        n = len(self._requests)
        if n < 2:
            return 0.0
        span = self._requests[-1].finished_at - self._requests[0].finished_at
        if not span > 0.0 or not math.isfinite(span):
            return 0.0
        return (n - 1) / span

    # ------------------------------------------------------------------ continuity / TTL-pause averages

    def average_cache_miss_impact_seconds(self) -> float:
        """Mean cache-miss impact over the continuity window (0 when empty)."""
        n = len(self._continuity)
        return self._impact_sum / n if n > 0 else 0.0

    def average_ttl_pause_rounds(self) -> float:
        n = len(self._ttl_pause_rounds)
        return self._ttl_rounds_sum / n if n > 0 else 0.0

    def log_normal_fit(self) -> LogNormalFit | None:
        """Fit of the positive finite intervals in the window, O(1) (None when there are none).

        The scheduler passes it to ``ttl_fit.fitted_acting_ttl_from_fit`` so the fit is not redone per call.
        """
        if self._fit_valid:
            return self._fit
        n = self._log_count
        if n <= 0:
            fit = None
        else:
            mu = self._log_sum / n
            variance = max(0.0, self._log_sq_sum / n - mu * mu)
            fit = LogNormalFit(mu, max(math.sqrt(variance), MIN_LOG_SIGMA), n)  # μ, σ, samples
        self._fit = fit
        self._fit_valid = True
        return fit

    # ------------------------------------------------------------------ internals

    def _add_request(self, s: RequestSample) -> None:
        self._prompt_sum += s.prompt_tokens
        self._completion_sum += s.completion_tokens
        self._cached_sum += s.cached_prompt_tokens
        if s.context_growth_tokens is not None:
            self._growth_sum += s.context_growth_tokens
            self._growth_count += 1
        self._rounds_sum += s.rounds_since_ttl_pause
        self._e2e_sum += s.e2e_seconds
        self._queue_sum += s.queue_seconds
        if s.decode_seconds is not None:
            self._decode_sum += s.decode_seconds
            self._decode_count += 1

    def _remove_request(self, s: RequestSample) -> None:
        self._prompt_sum -= s.prompt_tokens
        self._completion_sum -= s.completion_tokens
        self._cached_sum -= s.cached_prompt_tokens
        if s.context_growth_tokens is not None:
            self._growth_sum -= s.context_growth_tokens
            self._growth_count -= 1
        self._rounds_sum -= s.rounds_since_ttl_pause
        self._e2e_sum -= s.e2e_seconds
        self._queue_sum -= s.queue_seconds
        if s.decode_seconds is not None:
            self._decode_sum -= s.decode_seconds
            self._decode_count -= 1

    def _resum_requests(self) -> None:
        requests = self._requests  # (lists, not generators: fsum reads them without a call per sample)
        self._e2e_sum = math.fsum([s.e2e_seconds for s in requests])
        self._queue_sum = math.fsum([s.queue_seconds for s in requests])
        self._decode_sum = math.fsum([s.decode_seconds for s in requests if s.decode_seconds is not None])
        self._request_evictions = 0

    def _resum_continuity(self) -> None:
        self._impact_sum = math.fsum([s.cache_miss_impact_seconds for s in self._continuity])
        logs = [log for log in self._logs if log is not None]
        self._log_sum = math.fsum(logs)
        self._log_sq_sum = math.fsum([x * x for x in logs])
        self._log_count = len(logs)
        self._continuity_evictions = 0


class RankStats:
    """Every Rank's ``RankFactors``, each made when its first sample arrives; dropped with the Rank."""

    __slots__ = ("_by_rank", "_window")

    def __init__(self, window_size: int) -> None:
        self._window = window_size
        self._by_rank: dict[str, RankFactors] = {}

    def get(self, rank_id: str) -> RankFactors | None:
        return self._by_rank.get(rank_id)

    def of(self, rank_id: str) -> RankFactors:
        """The Rank's statistics, made empty on first use (to push a sample)."""
        factors = self._by_rank.get(rank_id)
        if factors is None:
            factors = self._by_rank[rank_id] = RankFactors(self._window)
        return factors

    def values(self) -> ValuesView[RankFactors]:
        return self._by_rank.values()

    def __len__(self) -> int:
        return len(self._by_rank)

    def forget(self, rank_id: str) -> None:
        self._by_rank.pop(rank_id, None)
