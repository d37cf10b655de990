"""The router names the KV size vLLM reports when ``token_capacity_per_dp_rank`` is unset — once per size."""

from __future__ import annotations

from progrouter.observe.capacity_hint import EVENT, CapacityHint
from progrouter.program.observer import RecordingObserver
from progrouter.routing.target import Target


def page(*blocks: int, block_size: int = 16) -> str:
    """A /metrics page whose engine i has ``blocks[i]`` blocks (the emulator's labels)."""
    lines = [
        f'vllm:cache_config_info{{block_size="{block_size}",engine="{i}",num_gpu_blocks="{n}"}} 1.0'
        for i, n in enumerate(blocks)
    ]
    return 'vllm:num_requests_running{engine="0"} 0\n' + "\n".join(lines) + "\n"


def ranks(url: str, n: int) -> list[Target]:
    return [Target.parse(f"{url}@{r}") for r in range(n)]


def test_names_the_smallest_rank_of_a_worker_once() -> None:
    observer = RecordingObserver()
    hint = CapacityHint(observer, max_active_programs_per_target=64)
    for _ in range(3):
        hint.saw("http://w0", page(100, 80), ranks("http://w0", 2))
    (told,) = observer.events_named(EVENT)
    assert told["reported_kv_tokens_per_dp_rank"] == 80 * 16
    assert told["max_active_programs_per_target"] == 64
    assert told["base_url"] == "http://w0"
    assert [level for level, name, _ in observer.events if name == EVENT] == ["warning"]


def test_a_smaller_worker_is_named_again_a_larger_one_is_not() -> None:
    observer = RecordingObserver()
    hint = CapacityHint(observer, max_active_programs_per_target=8)
    hint.saw("http://w0", page(100), ranks("http://w0", 1))
    hint.saw("http://w1", page(200), ranks("http://w1", 1))
    hint.saw("http://w2", page(50), ranks("http://w2", 1))
    sizes = [e["reported_kv_tokens_per_dp_rank"] for e in observer.events_named(EVENT)]
    assert sizes == [1600, 800]
    assert hint.told == 800


def test_only_the_targets_ranks_count_and_pages_without_the_family_say_nothing() -> None:
    observer = RecordingObserver()
    hint = CapacityHint(observer, max_active_programs_per_target=64)
    hint.saw("http://w0", 'vllm:num_requests_running{engine="0"} 0\n', ranks("http://w0", 1))
    hint.saw("http://w0", page(100, 10), [Target.parse("http://w0@0")])  # engine 1 is not a target
    hint.saw("http://w0", page(0), ranks("http://w0", 1))  # a zero size is no size
    assert [e["reported_kv_tokens_per_dp_rank"] for e in observer.events_named(EVENT)] == [1600]
