"""Parsing vLLM's /metrics: only the three families, per engine, mapped to Ranks, nothing fabricated."""

from __future__ import annotations

import pytest

from progrouter.observe.vllm_metrics import observations_for_targets, parse_vllm_metrics
from progrouter.program.types import BackendObservation
from progrouter.routing.target import Target

pytestmark = pytest.mark.timeout(30)

METRICS = r"""
# HELP vllm:kv_cache_usage_perc GPU KV cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:num_requests_running{engine="0",model_name="m"} 2
vllm:num_requests_waiting{engine="0",model_name="m"} 1
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
vllm:num_requests_running{engine="1",model_name="m"} 4.0
vllm:num_requests_waiting{engine="1",model_name="m"} 3.0
unrelated_metric{engine="1",label="escaped\"comma,value"} 99
# HELP vllm:prompt_tokens_total Prompt tokens.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 12345
vllm:num_requests_running_extra{engine="0"} 77
"""


def test_parses_only_the_required_series_per_engine() -> None:
    parsed = parse_vllm_metrics(METRICS)
    assert parsed == {
        0: BackendObservation(kv_cache_usage=0.25, running=2, waiting=1),
        1: BackendObservation(kv_cache_usage=0.75, running=4, waiting=3),
    }


def test_missing_engine_label_means_engine_zero_and_labels_may_be_quoted_oddly() -> None:
    text = (
        'vllm:kv_cache_usage_perc{model_name="a\\"b,c"} 0.5\n'
        "vllm:num_requests_running 1\n"
        "vllm:num_requests_waiting 0\n"
    )
    assert parse_vllm_metrics(text) == {0: BackendObservation(0.5, 1, 0)}


def test_an_engine_missing_a_series_or_with_nan_yields_nothing() -> None:
    text = (
        'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
        'vllm:num_requests_running{engine="0"} 1\n'
        'vllm:kv_cache_usage_perc{engine="1"} NaN\n'
        'vllm:num_requests_running{engine="1"} 1\n'
        'vllm:num_requests_waiting{engine="1"} 1\n'
    )
    assert parse_vllm_metrics(text) == {}


def test_malformed_exposition_raises_value_error() -> None:
    with pytest.raises(ValueError):
        parse_vllm_metrics('vllm:kv_cache_usage_perc{engine="0" 0.5\n')


def test_maps_internal_dp_ranks_to_targets_and_skips_missing_engines() -> None:
    targets = [Target.parse(f"http://worker@{r}") for r in (0, 1, 2)] + [Target.parse("http://single")]
    mapped = observations_for_targets(targets, parse_vllm_metrics(METRICS))
    assert mapped["http://worker@0"].kv_cache_usage == 0.25
    assert mapped["http://worker@1"].waiting == 3
    assert "http://worker@2" not in mapped
    assert mapped["http://single"].running == 2  # no DP suffix: engine 0
