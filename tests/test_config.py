"""The configuration contract: spec defaults, every validation rule of upstream §7.3, aliases, strictness."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from progrouter.config import (
    ActingTTLPolicy,
    BindingStrategy,
    ConfigError,
    EnableKey,
    ProgramSchedulingConfig,
    ResumeOrder,
    RouterConfig,
    parse_config,
)


def _parse(data: dict[str, Any]) -> ProgramSchedulingConfig:
    return parse_config(ProgramSchedulingConfig, data, prefix="program_scheduling_config_json")


def _rejects(data: dict[str, Any], *fragments: str) -> None:
    with pytest.raises(ConfigError) as info:
        _parse(data)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_defaults_match_the_spec() -> None:
    c = ProgramSchedulingConfig()
    assert c.program_scheduling_enable_key is EnableKey.CANONICAL
    assert (c.binding_only, c.global_queue, c.resume_order) == (False, False, ResumeOrder.MRU)
    assert c.cross_rank_headroom_ratio == 1.2
    assert c.binding_strategy is BindingStrategy.CONSISTENT_HASH
    assert c.hash_virtual_nodes == 160
    assert c.token_capacity_per_dp_rank is None
    assert c.max_active_programs_per_target == 64
    assert c.metrics_interval_seconds == 1.0
    assert c.admission_waiting_request_threshold == 1
    assert (c.queue_timeout_seconds, c.force_resume_timeout_seconds) == (600.0, 300.0)
    assert c.paused_retention_ttl_seconds == 1800.0
    assert c.shared_prefix_freshness_warmup_seconds == 100.0
    assert c.shared_prefix_freshness_kv_turnovers == 2.0
    assert c.decode_buffer_tokens == 100
    assert c.max_acting_ttl_seconds == 10.0
    assert (c.high_watermark_ratio, c.low_watermark_ratio) == (1.0, 1.0)
    assert (c.max_segment_rounds, c.stats_window_size) == (14, 100)
    assert c.enable_batch_gain_admission is True
    p, d = c.prefill_cost_model, c.decode_throughput_model
    assert p.intercept_seconds == 0.06600061907132926
    assert p.linear_seconds_per_1k_tokens == 0.05702024012166613
    assert p.quadratic_seconds_per_1k_tokens_squared == 0.0044057347937978475
    assert p.decode_throughput_alpha == 0.15
    assert d.fixed_step_seconds == 0.010635218423115973
    assert d.batch_step_seconds_per_request == 0.0004192803698834784
    assert d.context_step_seconds_per_token == 1.420458414996201e-7


def test_improvements_beyond_the_spec_default_off() -> None:
    """The switches of docs/scheduler.md's "Improvements beyond the spec" default to the spec's behaviour,
    and an unknown value is refused with the field's name."""
    c = ProgramSchedulingConfig()
    assert c.acting_ttl_policy is ActingTTLPolicy.SPEC
    assert (c.weighed_ttl_max_seconds, c.weighed_ttl_check_seconds) == (120.0, 5.0)
    assert _parse({"acting_ttl_policy": "weighed"}).acting_ttl_policy is ActingTTLPolicy.WEIGHED
    assert _parse({"acting_ttl_policy": "fixed"}).acting_ttl_policy is ActingTTLPolicy.FIXED
    _rejects({"acting_ttl_policy": "forever"}, "acting_ttl_policy")


def test_reasoning_token_balance_requires_capacity() -> None:
    _rejects({"binding_strategy": "reasoning_token_balance"}, "requires token_capacity_per_dp_rank")
    ok = _parse({"binding_strategy": "reasoning_token_balance", "token_capacity_per_dp_rank": 1000})
    assert ok.binding_strategy is BindingStrategy.REASONING_TOKEN_BALANCE


@pytest.mark.parametrize(
    "field",
    [
        "metrics_interval_seconds",
        "queue_timeout_seconds",
        "force_resume_timeout_seconds",
        "paused_retention_ttl_seconds",
        "shared_prefix_freshness_kv_turnovers",
        "weighed_ttl_max_seconds",
        "weighed_ttl_check_seconds",
    ],
)
@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
def test_finite_and_positive(field: str, value: float) -> None:
    _rejects({field: value}, field, "Must be finite and > 0")


@pytest.mark.parametrize("field", ["max_acting_ttl_seconds", "shared_prefix_freshness_warmup_seconds"])
@pytest.mark.parametrize("value", [-0.5, math.nan, math.inf])
def test_finite_and_non_negative(field: str, value: float) -> None:
    _rejects({field: value}, field, "Must be finite and >= 0")
    assert getattr(_parse({field: 0.0}), field) == 0.0


@pytest.mark.parametrize(
    ("group", "field"),
    [
        ("prefill_cost_model", "intercept_seconds"),
        ("prefill_cost_model", "linear_seconds_per_1k_tokens"),
        ("prefill_cost_model", "quadratic_seconds_per_1k_tokens_squared"),
        ("decode_throughput_model", "batch_step_seconds_per_request"),
        ("decode_throughput_model", "context_step_seconds_per_token"),
    ],
)
@pytest.mark.parametrize("value", [-1e-9, math.nan])
def test_cost_coefficients_finite_and_non_negative(group: str, field: str, value: float) -> None:
    _rejects({group: {field: value}}, f"{group}.{field}", "Must be finite and >= 0")
    assert getattr(getattr(_parse({group: {field: 0.0}}), group), field) == 0.0


@pytest.mark.parametrize("value", [-0.01, 1.01, math.nan])
def test_alpha_between_0_and_1(value: float) -> None:
    _rejects({"prefill_cost_model": {"decode_throughput_alpha": value}}, "between 0 and 1 inclusive")
    for ok in (0.0, 1.0):
        assert (
            _parse(
                {"prefill_cost_model": {"decode_throughput_alpha": ok}}
            ).prefill_cost_model.decode_throughput_alpha
            == ok
        )


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan])
def test_fixed_step_finite_and_positive(value: float) -> None:
    _rejects({"decode_throughput_model": {"fixed_step_seconds": value}}, "fixed_step_seconds", "> 0")


@pytest.mark.parametrize(
    "field",
    ["hash_virtual_nodes", "max_active_programs_per_target", "stats_window_size", "max_segment_rounds"],
)
def test_counts_positive(field: str) -> None:
    _rejects({field: 0}, field, "counts and configured token capacity must be > 0")


def test_capacity_zero_rejected_null_allowed() -> None:
    _rejects({"token_capacity_per_dp_rank": 0}, 'is not a positive integer, "auto" or null')
    assert _parse({"token_capacity_per_dp_rank": None}).token_capacity_per_dp_rank is None


@pytest.mark.parametrize("value", [0.99, math.nan, math.inf])
def test_headroom_ratio_finite_and_at_least_one(value: float) -> None:
    _rejects({"cross_rank_headroom_ratio": value}, "cross_rank_headroom_ratio must be finite and >= 1")


@pytest.mark.parametrize(
    ("low", "high"), [(0.0, 1.0), (0.9, 1.1), (0.8, 0.7), (math.nan, 1.0), (0.5, math.nan), (-0.1, 0.5)]
)
def test_watermarks(low: float, high: float) -> None:
    _rejects({"low_watermark_ratio": low, "high_watermark_ratio": high}, "0 < low <= high <= 1")


def test_watermarks_accepted_at_the_boundaries() -> None:
    c = _parse({"low_watermark_ratio": 0.5, "high_watermark_ratio": 0.5})
    assert (c.low_watermark_ratio, c.high_watermark_ratio) == (0.5, 0.5)


def test_force_resume_must_not_exceed_queue_timeout() -> None:
    _rejects(
        {"force_resume_timeout_seconds": 601, "queue_timeout_seconds": 600},
        "force_resume_timeout_seconds must not exceed queue_timeout_seconds",
    )
    c = _parse({"force_resume_timeout_seconds": 10, "queue_timeout_seconds": 10})
    assert c.force_resume_timeout_seconds == c.queue_timeout_seconds


def test_waiting_threshold_and_decode_buffer_are_non_negative() -> None:
    assert _parse({"admission_waiting_request_threshold": 0}).admission_waiting_request_threshold == 0
    _rejects({"admission_waiting_request_threshold": -1}, "admission_waiting_request_threshold")
    _rejects({"decode_buffer_tokens": -1}, "decode_buffer_tokens")


def test_capacity_alias_is_accepted_and_never_serialized() -> None:
    c = _parse({"token_capacity_per_target": 456})
    assert c.token_capacity_per_dp_rank == 456
    dumped = c.to_json_dict()
    assert dumped["token_capacity_per_dp_rank"] == 456
    assert "token_capacity_per_target" not in dumped
    assert "token_capacity_per_target" not in json.dumps(dumped)


def test_enable_key_alias_and_values() -> None:
    assert _parse({"enable_key": "auto"}).program_scheduling_enable_key is EnableKey.AUTO
    canonical = _parse({"program_scheduling_enable_key": "vllm_xargs.agentic_context"})
    assert canonical.program_scheduling_enable_key is EnableKey.CANONICAL
    assert canonical.to_json_dict()["program_scheduling_enable_key"] == "vllm_xargs.agentic_context"
    _rejects({"enable_key": "sometimes"}, "enable_key", "'auto'")
    _rejects({"program_scheduling_enable_key": "always"}, "program_scheduling_enable_key")


def test_unknown_keys_are_errors_naming_them() -> None:
    _rejects(
        {"queue_timeout_secs": 5, "bogus": 1}, "unknown field 'queue_timeout_secs'", "unknown field 'bogus'"
    )
    _rejects({"prefill_cost_model": {"slope": 1}}, "unknown field 'prefill_cost_model.slope'")


def test_enum_values_are_checked() -> None:
    _rejects({"binding_strategy": "sticky"}, "binding_strategy")
    _rejects({"resume_order": "lifo"}, "resume_order")


def test_resolve_needs_the_enable_flag() -> None:
    assert ProgramSchedulingConfig.resolve(False, None) is None
    assert ProgramSchedulingConfig.resolve(True, None) == ProgramSchedulingConfig()
    with pytest.raises(ConfigError, match="requires enable_program_scheduling"):
        ProgramSchedulingConfig.resolve(False, "{}")
    with pytest.raises(ConfigError, match="Invalid program_scheduling_config_json"):
        ProgramSchedulingConfig.resolve(True, "{")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        ProgramSchedulingConfig.resolve(True, "[1]")
    resolved = ProgramSchedulingConfig.resolve(True, '{"global_queue": true}')
    assert resolved is not None and resolved.global_queue


def test_reference_calibration_warning_numbers() -> None:
    warning = ProgramSchedulingConfig().reference_calibration_warning()
    assert warning is not None
    assert warning["event"] == "program_scheduling_reference_calibration"
    assert len(warning["defaulted_fields"]) == 7
    assert warning["reference_prefill_tokens"] == 50_000
    assert warning["reference_prefill_seconds"] == pytest.approx(13.93, abs=0.005)
    assert warning["reference_decode_batch_size"] == 4
    assert warning["reference_decode_context_tokens"] == 200_000
    assert warning["reference_decode_throughput_tokens_per_second"] == pytest.approx(98.23, abs=0.005)


def test_calibration_warning_tracks_partially_given_fields() -> None:
    partial = _parse({"prefill_cost_model": {"intercept_seconds": 0.1}})
    fields = partial.defaulted_calibration_fields()
    assert "prefill_cost_model.intercept_seconds" not in fields
    assert "prefill_cost_model.linear_seconds_per_1k_tokens" in fields and len(fields) == 6
    # a round trip of the serialized defaults makes every coefficient explicit: no warning
    roundtrip = _parse(ProgramSchedulingConfig().to_json_dict())
    assert roundtrip.reference_calibration_warning() is None
    assert _parse({"binding_only": True}).reference_calibration_warning() is None


def test_router_config_rules() -> None:
    assert RouterConfig().worker_urls == []  # workers may be added at runtime, as upstream
    assert RouterConfig(policy="kv_aware").policy == "kv_aware"  # no sources: every Rank load-only
    with pytest.raises(ValueError, match="worker_urls"):
        RouterConfig(worker_urls=["localhost:8000"])
    with pytest.raises(ValueError, match="cache_threshold"):
        RouterConfig(worker_urls=["http://a:1"], cache_threshold=1.5)
    with pytest.raises(ValueError, match="balance_rel_threshold"):
        RouterConfig(worker_urls=["http://a:1"], balance_rel_threshold=0.5)
    with pytest.raises(ValueError, match="extra"):
        RouterConfig.model_validate({"worker_urls": ["http://a:1"], "polcy": "random"})
    c = RouterConfig(worker_urls=["http://a:1/"], program_scheduling=ProgramSchedulingConfig())
    assert c.worker_urls == ["http://a:1"]
    assert c.prometheus_port == 29000 and c.prometheus_host == "127.0.0.1"


@pytest.mark.parametrize("off", ["off", "OFF", "none", "null", "disabled", None])
def test_prometheus_port_can_be_turned_off(off: str | None) -> None:
    assert RouterConfig(prometheus_port=off).prometheus_port is None


def test_prometheus_port_rejects_other_words() -> None:
    with pytest.raises(ValueError, match="prometheus_port"):
        RouterConfig.model_validate({"prometheus_port": "later"})
    assert RouterConfig.model_validate({"prometheus_port": "0"}).prometheus_port == 0  # any free port


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"policy": "round_robin"}, "--kv-event-source requires the kv_aware policy"),
        ({"kv_event_model": None}, "static KV event sources require worker URLs and model identity"),
        ({"kv_event_source": ["http://b:1=tcp://b:5557"]}, "'http://b:1' is not in --worker-urls"),
        ({"kv_event_source": ["http://a:1"]}, "expects WORKER_URL=ENDPOINT"),
        ({"kv_event_source": ["http://a:1=b:5557"]}, "is not a ZMQ endpoint"),
        (
            {"kv_event_source": ["http://a:1=tcp://a:1", "http://a:1/=tcp://a:2"]},
            "duplicate --kv-event-source",
        ),
        ({"intra_node_data_parallel_size": 2}, "one endpoint per DP Rank"),
        ({"kv_event_replay_source": ["http://c:1=tcp://c:1"]}, "requires a matching --kv-event-source"),
        ({"kv_event_replay_source": ["http://a:1=tcp://a:1,tcp://a:2"]}, "one replay endpoint per event"),
        ({"router_temperature": -1}, "router_temperature"),
        ({"kv_aware_session_affinity_ttl_secs": 0}, "kv_aware_session_affinity_ttl_secs"),
        ({"kv_penalty_disk": 1.5}, "kv_penalty_disk"),
        (
            {
                "program_scheduling": {
                    "residency_aware": True,
                    "kv_event_sources": {"http://a:1": "tcp://a:5557"},
                },
            },
            "leave program_scheduling.kv_event_sources empty",
        ),
        (
            {"program_scheduling": {"residency_aware": True, "kv_event_block_size": 32}},
            "leave program_scheduling.kv_event_block_size unset",
        ),
    ],
)
def test_kv_aware_settings_are_checked_as_upstream(fields: dict[str, object], message: str) -> None:
    good: dict[str, object] = {
        "worker_urls": ["http://a:1"],
        "policy": "kv_aware",
        "kv_event_source": ["http://a:1=tcp://a:5557"],
        "kv_event_model": "m",
    }
    RouterConfig(**good)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        RouterConfig(**{**good, **fields})  # type: ignore[arg-type]


def test_residency_aware_reads_one_set_of_kv_event_sources() -> None:
    """Its own sources, or with --policy kv_aware the policy's; the sans-I/O config alone (the simulator
    reads its Ranks' block pools) needs none."""
    residency = {"residency_aware": True}
    assert ProgramSchedulingConfig(**residency).residency_aware  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="residency_aware needs kv_event_sources"):
        RouterConfig(worker_urls=["http://a:1"], program_scheduling=residency)  # type: ignore[arg-type]
    shared = RouterConfig(
        worker_urls=["http://a:1"],
        policy="kv_aware",  # type: ignore[arg-type]
        kv_event_source=["http://a:1=tcp://a:5557"],
        kv_event_model="m",
        program_scheduling=residency,  # type: ignore[arg-type]
    )
    assert shared.program_scheduling is not None and shared.program_scheduling.residency_aware
