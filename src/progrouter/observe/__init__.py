"""Backend observation: what vLLM itself reports about each Rank, scraped from ``/metrics``."""

from progrouter.observe.poller import MetricsScraper, run_observation_loop
from progrouter.observe.vllm_metrics import observations_for_targets, parse_vllm_metrics

__all__ = ["MetricsScraper", "observations_for_targets", "parse_vllm_metrics", "run_observation_loop"]
