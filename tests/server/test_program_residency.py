"""The residency shell's bookkeeping: prompt samples, reports, bounds (its index fed by hand)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from progrouter.config import ProgramSchedulingConfig
from progrouter.program.residency_prompts import SAMPLED_BLOCKS, PromptSample
from progrouter.routing.kv_residency import chain_keys
from progrouter.routing.target import Target
from progrouter.server.program_residency import (
    ProgramResidency,
    prompt_token_ids,
)

BS = 4
RANKS = [Target.parse("http://w:1@0"), Target.parse("http://w:1@1")]


def shell(**config: object) -> ProgramResidency:
    cfg = ProgramSchedulingConfig(
        residency_aware=True,
        kv_event_sources={"http://w:1": "tcp://127.0.0.1:5557"},
        kv_event_block_size=BS,
        **config,  # type: ignore[arg-type]
    )
    return ProgramResidency(cfg, CollectorRegistry())


def store(residency: ProgramResidency, rank: str, seq: int, tokens: list[int]) -> None:
    """Rank ``rank`` announces ``tokens``' full blocks as one chain (engine hashes 1, 2, ...)."""
    n = len(tokens) // BS
    event = ["BlockStored", list(range(1, n + 1)), None, tokens[: n * BS], BS, None, "GPU"]
    residency.index.apply(rank, seq, 0.0, [event], now=1e12)


def test_only_token_id_prompts_are_matched() -> None:
    assert prompt_token_ids({"prompt": [1, 2, 3]}) == [1, 2, 3]
    for body in (None, {"prompt": "text"}, {"messages": []}, {"prompt": [[1, 2]]}, {"prompt": [1, True]}):
        assert prompt_token_ids(body) is None  # type: ignore[arg-type]


def test_a_short_prompt_is_kept_whole_and_a_long_one_sampled() -> None:
    keys = chain_keys(list(range(40 * BS)), BS)
    assert PromptSample.of(keys) == PromptSample(tuple(range(40)), tuple(keys))
    long_keys = chain_keys(list(range(1000 * BS)), BS)
    sample = PromptSample.of(long_keys)
    assert len(sample.keys) == SAMPLED_BLOCKS and sample.positions[-1] == 999 and sample.blocks == 1000
    assert sample.keys == tuple(long_keys[i] for i in sample.positions)


def test_reports_say_what_each_known_rank_holds() -> None:
    residency = shell()
    prompt = list(range(100, 100 + 10 * BS + 2))  # 10 full blocks and 2 tokens
    assert residency.arrival(("pool", "a"), {"prompt": prompt}, RANKS) == (10 * BS, {})  # unknown Ranks
    store(residency, RANKS[0].id, 0, prompt[: 6 * BS])
    store(residency, RANKS[1].id, 0, [7] * BS)
    assert residency.report(RANKS) == {("pool", "a"): (10 * BS, {RANKS[0].id: 6 * BS, RANKS[1].id: 0})}
    assert residency.arrival(("pool", "b"), {"messages": [{"role": "user", "content": "x"}]}, RANKS) is None


def test_a_long_prompt_reports_down_to_the_last_sampled_block_held() -> None:
    residency = shell()
    prompt = list(range(1000 * BS))
    residency.arrival(("pool", "a"), {"prompt": prompt}, RANKS)
    store(residency, RANKS[0].id, 0, prompt[: 500 * BS])
    [(covered, held)] = residency.report(RANKS[:1]).values()
    assert covered == 1000 * BS
    assert 500 * BS - 1000 * BS // SAMPLED_BLOCKS <= held[RANKS[0].id] <= 500 * BS


def test_remembered_programs_are_bounded() -> None:
    residency = shell(max_paused_programs=2, max_pooled_requests=1)
    for i in range(5):
        residency.arrival(("pool", f"p{i}"), {"prompt": [1] * BS}, RANKS)
    assert list(residency.report(RANKS)) == [("pool", "p2"), ("pool", "p3"), ("pool", "p4")]
