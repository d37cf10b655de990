"""Local counter, gauge and histogram families render exactly what prometheus_client's own families render."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from progrouter.server.telemetry.local_metrics import LocalCounter, LocalGauge, LocalHistogram

pytestmark = pytest.mark.timeout(30)

BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0, 120.0)
VALUES = (0.0, 0.0005, 0.001, 0.0011, 0.05, 1.0, 3.5, 119.9, 120.0, 121.0, 1e9, math.inf, math.nan, -1.0)


def test_a_local_counter_renders_as_a_prometheus_counter() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Counter("demo", "Demo counter", ("route", "worker"), registry=theirs)
    local = LocalCounter("demo_total", "Demo counter", ("route", "worker"), ours)
    assert generate_latest(ours) == generate_latest(theirs)  # no series yet: the family's head alone
    steps = ((("/a", "w1"), 1.0), (("/b", "w1"), 2.5), (("/a", "w1"), 1.0), (("/a", "w2"), 0.0))
    for labels, amount in steps:
        reference.labels(*labels).inc(amount)
        local.labels(*labels).inc(amount)
    assert generate_latest(ours) == generate_latest(theirs)
    assert ours.get_sample_value("demo_total", {"route": "/a", "worker": "w1"}) == 2.0
    with pytest.raises(ValueError):
        local.labels("/a", "w1").inc(-1.0)
    with pytest.raises(ValueError):
        local.labels("/a")


def test_a_local_counter_without_labels_is_one_series_from_the_start() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Counter("hits", "Demo hits", registry=theirs)
    local = LocalCounter("hits_total", "Demo hits", (), ours)
    assert generate_latest(ours) == generate_latest(theirs)
    reference.inc()
    local.inc()
    assert generate_latest(ours) == generate_latest(theirs)


def test_a_local_gauge_renders_as_a_prometheus_gauge() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Gauge("demo_ratio", "Demo gauge", ("target", "window"), registry=theirs)
    local = LocalGauge("demo_ratio", "Demo gauge", ("target", "window"), ours)
    assert generate_latest(ours) == generate_latest(theirs)  # no series yet: the family's head alone
    steps = ((("t1", "request"), 1), (("t2", "request"), 0.25), (("t1", "continuity"), -3.5))
    steps += ((("t1", "request"), math.inf), (("t2", "request"), math.nan), (("t1", "continuity"), 1e9))
    for labels, value in steps:
        reference.labels(*labels).set(value)
        local.labels(*labels).set(value)
        assert generate_latest(ours) == generate_latest(theirs)
    for family in (reference, local):  # a removed series goes; set again, it comes back last
        family.remove("t1", "request")
        family.remove("t9", "request")  # not there: nothing happens
    assert generate_latest(ours) == generate_latest(theirs)
    reference.labels("t1", "request").set(2.0)
    local.labels("t1", "request").set(2.0)
    assert generate_latest(ours) == generate_latest(theirs)
    assert ours.get_sample_value("demo_ratio", {"target": "t1", "window": "request"}) == 2.0
    with pytest.raises(ValueError):
        local.labels("t1")


def test_a_local_gauge_without_labels_is_one_series_from_the_start() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Gauge("level", "Demo level", registry=theirs)
    local = LocalGauge("level", "Demo level", (), ours)
    assert generate_latest(ours) == generate_latest(theirs)
    reference.set(4)
    local.labels().set(4)
    assert generate_latest(ours) == generate_latest(theirs)


@pytest.mark.parametrize("labelnames", [(), ("target", "route")])
def test_a_local_histogram_renders_as_a_prometheus_histogram(labelnames: tuple[str, ...]) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("demo_seconds", "Demo histogram", labelnames, buckets=BUCKETS, registry=theirs)
    local = LocalHistogram("demo_seconds", "Demo histogram", labelnames, ours, BUCKETS)
    assert generate_latest(ours) == generate_latest(theirs)
    for index, value in enumerate(VALUES):
        if labelnames:
            labels = ("t1" if index % 3 else "t2", "/v1/chat/completions")
            reference.labels(*labels).observe(value)
            local.labels(*labels).observe(value)
        else:
            reference.observe(value)
            local.observe(value)
    assert generate_latest(ours) == generate_latest(theirs)


def test_a_duplicate_family_name_is_refused_as_prometheus_client_refuses_it() -> None:
    registry = CollectorRegistry()
    LocalCounter("demo_total", "Demo counter", (), registry)
    with pytest.raises(ValueError):
        Counter("demo", "Demo counter", registry=registry)
    LocalHistogram("demo_seconds", "Demo histogram", (), registry, BUCKETS)
    with pytest.raises(ValueError):
        Histogram("demo_seconds", "Demo histogram", registry=registry)
    LocalGauge("demo_ratio", "Demo gauge", (), registry)
    with pytest.raises(ValueError):
        Gauge("demo_ratio", "Demo gauge", registry=registry)
