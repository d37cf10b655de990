"""``epp_counter_usage``: each response's usage estimated from its worker's vLLM counters, for ``end``.

In ``end`` no response body reaches the EPP, so no request reports its usage. vLLM counts, per engine, the
prompt tokens it prefilled and how many of them came from its prefix cache, the tokens it generated and the
requests it finished. Read as often as the scheduler reads vLLM's gauges, their growth against the request
bytes the EPP sent to that engine gives a Rank's prompt tokens per request byte, its cached share of prompt
tokens and its completion tokens per request (decaying sums, so a change of traffic shows within a few
reads). Each completion then reports prompt = its body's bytes × tokens per byte, cached = prompt × cached
share, completion = the Rank's mean: a Rank's averages standing in for the request's own figures
(docs/epp.md says what that costs). Nothing is reported for a Rank until it has finished a request since
the EPP began reading it. Traffic that reaches a worker around the EPP inflates its counters against the
EPP's bytes.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from progrouter.observe.vllm_metrics import _engine, _lines, _prefixes
from progrouter.program import UsageObservation
from progrouter.routing.target import Target

log = logging.getLogger("progrouter.epp")
PROMPT = "vllm:prompt_tokens"
CACHED = "vllm:prompt_tokens_cached"
GENERATED = "vllm:generation_tokens"
FINISHED = "vllm:request_success"
FAMILIES = (PROMPT, CACHED, GENERATED, FINISHED)
_PREFIXES = _prefixes(*(f"{name}_total" for name in FAMILIES))  # counters are exposed as ``<name>_total``
DECAY = 0.8  # per read: the weight of what the earlier reads saw


def parse_counters(text: str) -> dict[int, dict[str, float]]:
    """Per engine, the totals of ``FAMILIES`` (``request_success`` summed over its finish reasons)."""
    out: dict[int, dict[str, float]] = {}
    for family in text_string_to_metric_families(_lines(text, _PREFIXES)):
        if family.name not in FAMILIES:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and math.isfinite(sample.value):
                series = out.setdefault(_engine(sample.labels), {})
                series[family.name] = series.get(family.name, 0.0) + sample.value
    return out


@dataclass
class _Account:
    """One Rank: its counters at the last read, the bytes sent since, and the decaying sums."""

    last: Mapping[str, float] | None = None
    sent_bytes: int = 0
    bytes: float = 0.0
    prompt: float = 0.0
    cached: float = 0.0
    generated: float = 0.0
    finished: float = 0.0

    def read(self, now: Mapping[str, float]) -> None:
        last, self.last = self.last, now
        sent, self.sent_bytes = self.sent_bytes, 0
        if last is None or any(now.get(k, 0.0) < last.get(k, 0.0) for k in FAMILIES):
            return  # the first read, or the worker restarted (its counters went back): a new baseline

        def grew(name: str) -> float:
            return now.get(name, 0.0) - last.get(name, 0.0)

        self.bytes = self.bytes * DECAY + sent
        self.prompt = self.prompt * DECAY + grew(PROMPT)
        self.cached = self.cached * DECAY + grew(CACHED)
        self.generated = self.generated * DECAY + grew(GENERATED)
        self.finished = self.finished * DECAY + grew(FINISHED)

    def usage(self, body_bytes: int) -> UsageObservation | None:
        if self.finished <= 0 or self.bytes <= 0 or self.prompt <= 0:
            return None
        prompt = max(1, round(body_bytes * self.prompt / self.bytes))
        return UsageObservation(
            prompt_tokens=prompt,
            completion_tokens=round(self.generated / self.finished),
            cached_tokens=min(prompt, round(prompt * self.cached / self.prompt)),
        )


class CounterUsage:
    """The Ranks' accounts, fed by ``sent`` (each routed request) and ``run`` (the counter reads)."""

    def __init__(self) -> None:
        self._accounts: dict[str, _Account] = {}

    def _account(self, target: Target) -> _Account:
        account = self._accounts.get(target.id)
        if account is None:
            account = self._accounts[target.id] = _Account()
        return account

    def sent(self, target: Target, body_bytes: int) -> None:
        """A request of ``body_bytes`` went to ``target``."""
        self._account(target).sent_bytes += body_bytes

    def usage(self, target: Target, body_bytes: int) -> UsageObservation | None:
        """The usage to report for a request of ``body_bytes`` that ``target`` answered (None: not yet)."""
        return self._account(target).usage(body_bytes)

    def observe(self, targets: Sequence[Target], counters: Mapping[int, Mapping[str, float]]) -> None:
        """One read of the worker whose Ranks are ``targets``."""
        for target in targets:
            if target.rank in counters:
                self._account(target).read(counters[target.rank])

    def forget(self, keep: Sequence[Target]) -> None:
        """Drop the accounts of Ranks no longer configured (bounded by the worker set)."""
        ids = {t.id for t in keep}
        for gone in [i for i in self._accounts if i not in ids]:
            del self._accounts[gone]

    async def run(
        self,
        session: aiohttp.ClientSession,
        targets: Callable[[], Sequence[Target]],
        interval: float,
    ) -> None:
        """Read every worker's ``/metrics`` each ``interval`` seconds, until cancelled."""
        while True:
            current = list(targets())
            self.forget(current)
            by_url: dict[str, list[Target]] = {}
            for target in current:
                by_url.setdefault(target.base_url, []).append(target)
            await asyncio.gather(*(self._read(session, url, ranks) for url, ranks in by_url.items()))
            await asyncio.sleep(interval)

    async def _read(self, session: aiohttp.ClientSession, url: str, ranks: list[Target]) -> None:
        try:
            async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as response:
                if response.status != 200:
                    return
                text = await response.text()
            self.observe(ranks, parse_counters(text))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.debug("vLLM counters of a worker unreadable: %s", type(exc).__name__)
