"""Naming the KV size vLLM reports when Program scheduling was not told one.

The spec's defaults leave ``token_capacity_per_dp_rank`` unset, and then admission has only the Program-count
guard (64 Active Programs per Rank): at the loads where KV runs out, far fewer contexts than that fit, and
the defaults protect nothing (docs/scheduler.md, "The spec-default target"). vLLM reports each Rank's KV size
on the ``/metrics`` page the router already scrapes, so the router says which number to set — a warning, as
the spec's calibration warning is, and never a change of the configured behaviour.

Told once per smallest size seen: a later worker with a smaller KV (the setting is one value for every Rank)
is told again; repeats of a known size, and larger ones, are not. One integer of state. Reading costs a
substring test per scrape, and one scan of the page's lines when the family is on it.
"""

from __future__ import annotations

from collections.abc import Sequence

from progrouter.observe.vllm_metrics import kv_capacities
from progrouter.program import SchedulerObserver
from progrouter.routing.target import Target

EVENT = "token_capacity_unset"


class CapacityHint:
    """Reads ``vllm:cache_config_info`` off scrapes; warns ``event=token_capacity_unset`` with the size."""

    def __init__(self, observer: SchedulerObserver, max_active_programs_per_target: int) -> None:
        self._observer = observer
        self._count_guard = max_active_programs_per_target
        self._told: int | None = None  # the smallest per-Rank size named so far

    @property
    def told(self) -> int | None:
        return self._told

    def saw(self, base_url: str, metrics_text: str, targets: Sequence[Target]) -> None:
        """One worker's scrape (its Ranks ``targets``): warn if it shows a smaller KV than any named yet."""
        reported = kv_capacities(metrics_text)
        sizes = [reported[t.rank] for t in targets if t.rank in reported]
        if not sizes:
            return
        smallest = min(sizes)
        if smallest <= 0 or (self._told is not None and smallest >= self._told):
            return
        self._told = smallest
        self._observer.event(
            "warning",
            EVENT,
            base_url=base_url,
            reported_kv_tokens_per_dp_rank=smallest,
            max_active_programs_per_target=self._count_guard,
            advice=(
                'admission uses only the Program-count guard; set token_capacity_per_dp_rank ("auto" '
                "follows each Rank's reported size; or run progrouter calibrate) for token-based admission, "
                "growth reserve and capacity repair"
            ),
        )
