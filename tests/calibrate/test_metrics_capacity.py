"""The Rank's KV capacity read from ``vllm:cache_config_info`` (used to keep decode batches within KV)."""

from __future__ import annotations

from progrouter.calibrate.measure import parse_kv_capacity

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
    assert parse_kv_capacity(VLLM_DP2, 0) == 16384
    assert parse_kv_capacity(VLLM_DP2, 1) == 20000


def test_falls_back_to_blocks_times_block_size() -> None:
    assert parse_kv_capacity(EMULATOR, 0) == 188 * 16


def test_unknown_rank_or_garbage_gives_none() -> None:
    assert parse_kv_capacity(EMULATOR, 3) is None
    assert parse_kv_capacity("not { prometheus", 0) is None
    assert parse_kv_capacity("", 0) is None
