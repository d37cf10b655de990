"""Rank admission: may this Paused Program take a placement on that Rank now? And committing it if so.

The plan (upstream §3.4), in order:
1. the vLLM waiting gate: with a *fresh* observation whose ``num_requests_waiting`` reaches
   ``admission_waiting_request_threshold`` the Rank takes nobody, not even a forced resume;
2. a forced resume (its force-resume deadline passed) is admitted past the count and token limits, but
   only one at a time per Rank: while a Program admitted past the limits is Active there, a forced
   candidate that does not fit waits (``FORCE_BOUND``), so a deadline shared by many waiters is no stampede;
3. the count guard ``active + 1 ≤ max_active_programs_per_target`` (the only guard without token capacity);
4. token capacity: ``used + required ≤ C × low_watermark`` (immediate), and with the growth reserve too;
   when only the reserve fails, batch-gain admission may still admit.
Acting Programs are never reclaimed here: they hold their placement until their TTL or lifecycle ends it.

``RankView`` holds the facts every candidate of one Rank shares, so a scheduling pass computes them once.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple

from progrouter.config import ProgramSchedulingConfig
from progrouter.program.core.rank_capacity import watermark_tokens
from progrouter.program.formulas.batch_gain import BatchGainEstimate, BatchGainRank, rank_batch_gain
from progrouter.program.formulas.growth import growth_reserve, target_rounds

if TYPE_CHECKING:
    from progrouter.program.core.factors import RankFactors
    from progrouter.program.core.records import QueueEntry
    from progrouter.program.core.state import Program, RankPrograms
    from progrouter.program.types import BackendObservation


class Rejection(StrEnum):
    WAITING_GATE = "waiting_gate"  # blocks every candidate of the Rank, forced ones too
    COUNT = "count"  # blocks every candidate that is not forced
    CAPACITY = "capacity"  # this candidate's demand does not fit; a smaller one might
    RESERVE = "reserve"  # fits now, not with the growth reserve, and batch gain does not cover it
    FORCE_BOUND = "force_bound"  # forced, does not fit, and the Rank already holds one past its limits


class Verdict(StrEnum):
    ADMIT = "admit"  # fits with the growth reserve
    BATCH_GAIN = "batch_gain"  # fits now, not with the reserve, and the best-case batch gain might cover it


#: The verdicts ``judge`` answers, as plain globals: ``judge`` runs per candidate (why: ``state.ACTIVE``).
_COUNT, _CAPACITY, _RESERVE = Rejection.COUNT, Rejection.CAPACITY, Rejection.RESERVE
_ADMIT, _BATCH_GAIN = Verdict.ADMIT, Verdict.BATCH_GAIN


class RankView:
    """One Rank's admission facts at one instant; the growth reserve and batch-gain inputs are computed
    only when a candidate gets that far, and at most once per view."""

    __slots__ = (
        "_batch",
        "_best",
        "_covered_up_to",
        "_demand_limit",
        "_last_bounds",
        "_rank",
        "_refused_from",
        "_reserve",
        "_target_rounds",
        "active",
        "capacity",
        "config",
        "count_fits",
        "factors",
        "gate_blocked",
        "low_tokens",
        "observation",
        "overflow_busy",
        "rank_id",
        "used",
        "waiting",
    )

    def __init__(
        self,
        config: ProgramSchedulingConfig,
        rank_id: str,
        rank: RankPrograms,
        factors: RankFactors | None,
        observation: BackendObservation | None,
        used: float,
        capacity: int | None,
    ) -> None:
        """``observation``: the Rank's fresh backend observation, if any; ``used``: its managed usage;
        ``capacity``: its token capacity in force (``CapacityLedger.capacity``; None: the count guard)."""
        self.config = config
        self.rank_id = rank_id
        self._rank = rank
        self.factors = factors
        self.observation = observation
        threshold = config.admission_waiting_request_threshold
        self.waiting = 0 if observation is None else observation.waiting  # vLLM's, if freshly observed
        self.gate_blocked = threshold > 0 and self.waiting >= threshold
        self.active = active = rank.active_count
        self.count_fits = count_fits(active, config)
        self.overflow_busy = rank.overflow is not None
        self.used = used
        self.capacity = capacity
        self.low_tokens = watermark_tokens(capacity, config.low_watermark_ratio)
        self._target_rounds: int | None = None
        self._reserve: float | None = None
        self._demand_limit: float | None = None
        self._batch: BatchGainRank | None = None
        self._best: BatchGainEstimate | None = None
        self._covered_up_to = -math.inf  # the batch-gain bound's memo over uncached contexts
        self._refused_from = math.inf
        self._last_bounds: tuple[int, int, bool] | None = None

    @property
    def target_rounds(self) -> int:
        """The Rank's target rounds (policy's), computed when the reserve or batch gain first needs them."""
        rounds = self._target_rounds
        if rounds is None:
            rounds = self._target_rounds = target_rounds(self.factors, self.config.max_segment_rounds)
        return rounds

    def capacity_fits(self, required: float) -> bool:
        """The immediate token check: ``used + required ≤ C × low_watermark`` (always, without capacity)."""
        low = self.low_tokens
        return low is None or self.used + required <= low

    def judge(self, required: int, uncached: int) -> Rejection | Verdict:
        """The admission rule for an unforced candidate with this demand and uncached context: the
        count guard, the immediate token check, the growth reserve, and the best-case batch gain. ``plan``
        decides with it, the scheduling pass refuses early with it (from a queued Program's frozen facts,
        or from lower bounds of a whole queue's), and binding shares its first two checks."""
        if not self.count_fits:
            return _COUNT
        low = self.low_tokens
        if low is not None and not self.used + required <= low:  # ``capacity_fits``, written out here
            return _CAPACITY
        reserve = self._reserve
        if reserve is None:
            reserve = self.reserve
        if low is None or self.used + required + reserve <= low:
            return _ADMIT
        if uncached >= self._refused_from or not self._batch_bound_covers(uncached):
            return _RESERVE
        return _BATCH_GAIN

    def admits_some(self, required: int, uncached: int) -> bool:
        """``judge`` with lower bounds of several candidates' demand and uncached context: False means no
        unforced candidate among them can be admitted. (A pass asks for its queue's bounds more than once:
        the last answer is kept.)"""
        last = self._last_bounds
        if last is not None and last[0] == required and last[1] == uncached:
            return last[2]
        admits = not isinstance(self.judge(required, uncached), Rejection)
        self._last_bounds = (required, uncached, admits)
        return admits

    @property
    def demand_limit(self) -> float:
        """A demand above which the count guard or the immediate token check refuses (the largest one they
        let through; −inf when the count guard refuses everyone, inf without token capacity): a pass drops
        such candidates with one comparison, exactly as ``judge`` would."""
        limit = self._demand_limit
        if limit is None:
            low = self.low_tokens
            if not self.count_fits:
                limit = -math.inf
            elif low is None:
                limit = math.inf
            else:
                limit = largest_fitting(self.used, low)
            self._demand_limit = limit
        return limit

    def _batch_bound_covers(self, uncached: int) -> bool:
        """The best case bounds every candidate: the decode gain only shrinks with context, the recovery
        grows with the uncached context and the continuity loss with demand. The recovery never falls as the
        uncached context grows, so the largest context found covered and the least found not covered answer
        every candidate between without recomputing it."""
        if uncached <= self._covered_up_to:
            return True
        if uncached >= self._refused_from:
            return False
        best = self._best_case()
        recovery = self.config.prefill_cost_model.cache_miss_impact_seconds(uncached)
        if best.batch_gain_seconds >= recovery + best.continuity_loss_seconds:
            self._covered_up_to = float(uncached)  # the memo is a float (its bounds are infinities)
            return True
        self._refused_from = float(uncached)
        return False

    def _best_case(self) -> BatchGainEstimate:
        best = self._best
        if best is None:
            best = self._best = self._batch_rank().estimate(0, 0, 0.0)
        return best

    def batch_gain_admits(self, context_tokens: int, shared_prefix_tokens: int, required: int) -> bool:
        """Batch-gain admission of one reserve-failing candidate that passed the best-case bound (§3.6)."""
        return self._batch_rank().estimate(context_tokens, shared_prefix_tokens, float(required)).admits

    def _batch_rank(self) -> BatchGainRank:
        """The Rank's side, gathered once per view: the protected Programs enter as their total rounds and
        mean impact, which is all the formula uses of them."""
        batch = self._batch
        if batch is None:
            rank = self._rank
            count, remaining, impact = rank.protected(self.target_rounds)
            protected = ([float(remaining)], [impact / count]) if count else ([], [])
            batch = self._batch = rank_batch_gain(
                self.config,
                self.factors,
                low_watermark_tokens=self.low_tokens,
                batch_size_before=len(rank.reasoning),
                context_tokens_before=rank.reasoning_context,
                used_tokens=self.used,
                protected_remaining_rounds=protected[0],
                protected_cache_miss_impacts=protected[1],
            )
        return batch

    @property
    def reserve(self) -> float:
        """The growth reserve: room for every Active Program and the candidate to grow for their rounds."""
        if self._reserve is None:
            self._reserve = 0.0
            factors, rounds = self.factors, self.target_rounds
            if self.low_tokens is not None and rounds > 0 and factors is not None:
                self._reserve = growth_reserve(
                    factors.average_context_growth_tokens(),
                    rounds,
                    [self._rank.protected(rounds)[1]],
                )
        return self._reserve


def count_fits(active: int, config: ProgramSchedulingConfig) -> bool:
    """The count guard: ``active + 1 ≤ max_active_programs_per_target``."""
    return active + 1 <= config.max_active_programs_per_target


def largest_fitting(used: float, low: float) -> float:
    """The largest whole demand ``r`` with ``used + r <= low`` as floats add (inf, which drops nobody, when
    the difference is not a moderate number). The float sum never falls as ``r`` grows, so a guess from
    the difference is corrected by a few exact checks, galloping where the float spacing is coarse."""
    guess = low - used
    if not abs(guess) < 2.0**52:
        return math.inf  # no whole-number answer worth computing: an upper bound that drops nobody
    fits = math.floor(guess)
    if used + fits <= low:
        step = 1
        while used + (fits + step) <= low:
            fits += step
            step *= 2
        refused = fits + step
    else:
        refused, step = fits, 1
        while not used + (refused - step) <= low:
            refused -= step
            step *= 2
        fits = refused - step
    while refused - fits > 1:  # fits passes, refused does not
        middle = (fits + refused) // 2
        if used + middle <= low:
            fits = middle
        else:
            refused = middle
    return fits


class AdmissionPlan(NamedTuple):
    """An admission to commit (a tuple: one is made per admission)."""

    rank_id: str
    forced: bool
    batch_gain: bool
    overflow: bool  # a forced admission past the Rank's limits
    active: int
    used: float
    required: int
    reserve: float
    capacity: int | None  # the Rank's token capacity in force (None: the count guard alone)


def uncached_tokens(program: Program) -> int:
    """What a cold start of the Program recomputes: its context beyond the shared prefix."""
    return max(0, program.estimated_context_tokens - program.lifecycle.shared_prefix.tokens)


def plan(view: RankView, program: Program, entry: QueueEntry, now: float) -> AdmissionPlan | Rejection:
    """Admit a queued ``program`` (``entry``: its queue entry) on the view's Rank now? The waiting gate,
    then ``judge`` with the demand it was queued with; a forced resume passes a refusal unless the Rank
    already holds one past its limits."""
    if view.gate_blocked:
        return Rejection.WAITING_GATE
    forced = entry.forced_at <= now  # its force-resume deadline, as it was queued with it
    required = entry.required
    batch_gain = overflow = False
    verdict = view.judge(required, uncached_tokens(program))
    if isinstance(verdict, Rejection):
        if not forced:
            return verdict
        if view.overflow_busy:
            return Rejection.FORCE_BOUND
        overflow = True
    elif not forced and verdict is _BATCH_GAIN:
        shared = program.lifecycle.shared_prefix.tokens
        if not view.batch_gain_admits(program.estimated_context_tokens, shared, required):
            return Rejection.RESERVE
        batch_gain = True
    return _admission(view, required, view.reserve, forced=forced, batch_gain=batch_gain, overflow=overflow)


def plan_binding_only(view: RankView, required: int) -> AdmissionPlan:
    """``binding_only``: the Program is admitted on its last Rank (``view``'s) with no capacity check at all;
    ``required``: its demand."""
    return _admission(view, required, 0.0, forced=False, batch_gain=False, overflow=False)


def _admission(
    view: RankView,
    required: int,
    reserve: float,
    *,
    forced: bool = False,
    batch_gain: bool = False,
    overflow: bool = False,
) -> AdmissionPlan:
    """The plan to admit a candidate of demand ``required`` on the view's Rank as it stands."""
    return AdmissionPlan(
        view.rank_id, forced, batch_gain, overflow, view.active, view.used, required, reserve, view.capacity
    )
