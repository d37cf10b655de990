"""A Rank's KV size from ``vllm:cache_config_info`` (calibrate writes it; the router names it when unset)."""

from __future__ import annotations

from progrouter.observe.vllm_metrics import kv_capacities

# As vLLM 0.32 CPU prints it with --data-parallel-size 2 --num-gpu-blocks-override 512 --block-size 32.
_LABELS = (
    'block_size="32",engine="{e}",kv_cache_size_tokens="{t}",'
    'num_gpu_blocks="1024",num_gpu_blocks_override="512"'
)
VLLM_DP2 = (
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    + "".join(
        "vllm:cache_config_info{" + _LABELS.format(e=e, t=t) + "} 1.0\n"
        for e, t in (("0", 16384), ("1", 20000))
    )
)
EMULATOR = """# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",model_name="m",num_gpu_blocks="188"} 1.0
"""


def test_prefers_the_per_engine_token_size() -> None:
    assert kv_capacities(VLLM_DP2) == {0: 16384, 1: 20000}


def test_falls_back_to_blocks_times_block_size() -> None:
    assert kv_capacities(EMULATOR) == {0: 188 * 16}


def test_garbage_or_nothing_gives_no_size() -> None:
    assert kv_capacities("not { prometheus") == {}
    assert kv_capacities("") == {}
    assert kv_capacities('vllm:cache_config_info{block_size="16" 1.0\n') == {}  # a broken line


def test_read_among_the_other_families_an_engine_without_a_size_is_left_out() -> None:
    running, usage = 'vllm:num_requests_running{engine="0"} 3\n', 'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
    no_size = 'vllm:cache_config_info{engine="1",num_gpu_blocks="188"} 1.0\n'
    assert kv_capacities(running + EMULATOR + no_size + usage) == {0: 188 * 16}
