"""PrometheusObserver: §6.1 names, types, labels and buckets; typo detection; event logging."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from progrouter.server.gate.program_metrics import METRICS, PREFIX, PrometheusObserver, UnknownMetric

pytestmark = pytest.mark.timeout(30)

T = "http://w:8000@1"


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_every_metric_is_exposed_with_its_type() -> None:
    registry = CollectorRegistry()
    PrometheusObserver(registry, strict=True)
    text = generate_latest(registry).decode()
    for name, spec in METRICS.items():
        exposed = PREFIX + name
        assert f"# TYPE {exposed} {spec.kind}" in text, name
    assert len(METRICS) == 26


def test_transitions_gauges_counters_and_histograms_record() -> None:
    registry = CollectorRegistry()
    obs = PrometheusObserver(registry, strict=True)
    obs.transition(T, "program_admit")
    obs.transition(T, "program_admit")
    obs.gauge("rank_active_programs", 3, target=T)
    obs.gauge("rolling_samples", 7, target=T, window="continuity")
    obs.counter(
        "token_estimate_feedback_total", model_pool="p", endpoint="/v1/chat/completions", outcome="missing"
    )
    obs.histogram("armed_ttl_seconds", 0.0, target=T, source="fitted")
    obs.histogram("shared_prefix_observed_tokens", 200, target=T)
    assert value(registry, PREFIX + "transitions_total", target=T, reason="program_admit") == 2
    assert value(registry, PREFIX + "rank_active_programs", target=T) == 3
    assert value(registry, PREFIX + "rolling_samples", target=T, window="continuity") == 7
    labels = {"model_pool": "p", "endpoint": "/v1/chat/completions", "outcome": "missing"}
    assert value(registry, PREFIX + "token_estimate_feedback_total", **labels) == 1
    # Upstream's buckets: armed TTL has a 0 bucket, tokens go 0, 128, 256 …
    assert value(registry, PREFIX + "armed_ttl_seconds_bucket", target=T, source="fitted", le="0.0") == 1
    assert value(registry, PREFIX + "shared_prefix_observed_tokens_bucket", target=T, le="128.0") == 0
    assert value(registry, PREFIX + "shared_prefix_observed_tokens_bucket", target=T, le="256.0") == 1
    assert value(registry, PREFIX + "shared_prefix_observed_tokens_bucket", target=T, le="1.048576e+06") == 1
    # queue_wait_seconds is a summary with quantiles, as a scrape of upstream's wheel shows it
    for wait in (0.1, 0.3, 300.0):
        obs.histogram("queue_wait_seconds", wait, target=T)
    assert value(registry, PREFIX + "queue_wait_seconds_count", target=T) == 3
    assert value(registry, PREFIX + "queue_wait_seconds_sum", target=T) == pytest.approx(300.4)
    assert value(registry, PREFIX + "queue_wait_seconds", target=T, quantile="0") == 0.1
    assert value(registry, PREFIX + "queue_wait_seconds", target=T, quantile="0.5") == 0.3
    assert value(registry, PREFIX + "queue_wait_seconds", target=T, quantile="1") == 300.0
    assert value(registry, PREFIX + "queue_wait_seconds_bucket", target=T, le="+Inf") is None
    text = generate_latest(registry).decode()
    assert f"# TYPE {PREFIX}queue_wait_seconds summary" in text


@pytest.mark.parametrize(
    "call",
    [
        lambda o: o.gauge("rank_queue_sizes", 1, target=T),
        lambda o: o.histogram("rank_queue_size", 1, target=T),
        lambda o: o.gauge("rank_queue_size", 1, target=T, program="secret"),
        lambda o: o.gauge("rank_queue_size", 1),
        lambda o: o.transition(T, "admitted"),
        lambda o: o.histogram("armed_ttl_seconds", 1, target=T, source="guess"),
        lambda o: o.event("trace", "program_admit"),
    ],
)
def test_unknown_names_labels_and_enum_values_raise_in_strict_mode(call: object) -> None:
    obs = PrometheusObserver(CollectorRegistry(), strict=True)
    with pytest.raises(UnknownMetric):
        call(obs)  # type: ignore[operator]


def test_non_strict_drops_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="progrouter.program")
    registry = CollectorRegistry()
    obs = PrometheusObserver(registry, strict=False)
    obs.gauge("no_such_metric", 1, target=T)
    obs.gauge("no_such_metric", 2, target=T)
    assert len(caplog.records) == 1
    assert "no_such_metric" in caplog.records[0].getMessage()


def test_strict_is_on_under_pytest_by_default() -> None:
    assert PrometheusObserver(CollectorRegistry()).strict is True


def test_events_log_at_their_level_with_fields(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="progrouter.program")
    obs = PrometheusObserver(CollectorRegistry(), strict=True)
    obs.event("info", "program_admit", program="00ab", target=T, used_tokens=1.5, note="two words")
    obs.event("warning", "capacity_observation_fallback", target=T)
    obs.event("debug", "request_dispatch", program="00ab")  # below the enabled level: not emitted
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, f"event=program_admit program=00ab target={T} used_tokens=1.5 note='two words'"),
        (logging.WARNING, f"event=capacity_observation_fallback target={T}"),
    ]
    assert caplog.records[0].event == "program_admit"  # type: ignore[attr-defined]
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="progrouter.program")
    obs.event("debug", "request_dispatch", program="00ab")
    assert [r.getMessage() for r in caplog.records] == ["event=request_dispatch program=00ab"]


def test_forget_target_drops_its_gauge_series_only() -> None:
    registry = CollectorRegistry()
    obs = PrometheusObserver(registry, strict=True)
    other = "http://w:8000@0"
    for target in (T, other):
        obs.gauge("rank_active_programs", 2, target=target)
        obs.gauge("rolling_samples", 5, target=target, window="request")
    obs.transition(T, "ttl_expired")
    obs.forget_target(T)
    assert value(registry, PREFIX + "rank_active_programs", target=T) is None
    assert value(registry, PREFIX + "rolling_samples", target=T, window="request") is None
    assert value(registry, PREFIX + "rank_active_programs", target=other) == 2
    assert value(registry, PREFIX + "transitions_total", target=T, reason="ttl_expired") == 1


def test_bound_updates_stay_checked_and_forgetting_rebinds() -> None:
    registry = CollectorRegistry()
    obs = PrometheusObserver(registry, strict=True)
    for _ in range(2):  # a refused label set is never remembered as bound: it raises every time
        with pytest.raises(UnknownMetric):
            obs.gauge("rank_queue_size", 1, target=T, program="secret")
    obs.gauge("rank_queue_size", 3, target=T)
    obs.histogram("request_interval_seconds", 0.2, target=T)
    obs.forget_target(T)
    assert value(registry, PREFIX + "rank_queue_size", target=T) is None
    obs.gauge("rank_queue_size", 4, target=T)  # the Rank is back: its gauge is visible again
    obs.histogram("request_interval_seconds", 0.2, target=T)  # histograms keep their history
    obs.forget_target(T)  # and the series set again is tracked again, so it can be forgotten again
    assert value(registry, PREFIX + "rank_queue_size", target=T) is None
    assert value(registry, PREFIX + "request_interval_seconds_count", target=T) == 2


def test_debug_events_are_wanted_only_while_the_logger_is_enabled_for_them() -> None:
    logger = logging.getLogger("progrouter.program.test_wants_debug")
    obs = PrometheusObserver(CollectorRegistry(), strict=True, logger=logger)
    logger.setLevel(logging.INFO)
    assert not obs.wants_debug()
    logger.setLevel(logging.DEBUG)
    assert obs.wants_debug()
