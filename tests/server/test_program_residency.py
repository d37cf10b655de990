"""The residency shell's bookkeeping: prompt samples, reports, bounds, prompts through the tokenizer (its
index fed by hand)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from progrouter.agents.residency_prompts import SAMPLED_BLOCKS, PromptSample
from progrouter.config import ProgramSchedulingConfig
from progrouter.routing.kv_aware import OFFLOAD_BYTES
from progrouter.routing.kv_residency import ResidencyIndex, chain_keys
from progrouter.routing.target import Target
from progrouter.routing.tokenize import PromptTokenizer
from progrouter.server.gate.program_residency import ProgramResidency
from support.tiny_tokenizer import write_tiny_tokenizer

BS = 4
RANKS = [Target.parse("http://w:1@0"), Target.parse("http://w:1@1")]


def shell(tokenizer: PromptTokenizer | None = None, **config: object) -> ProgramResidency:
    cfg = ProgramSchedulingConfig(residency_aware=True, kv_event_block_size=BS, **config)  # type: ignore[arg-type]
    residency = ProgramResidency(cfg, CollectorRegistry(), tokenizer=tokenizer, shared=ResidencyIndex())
    residency.set_targets(RANKS)
    return residency


async def arrive(residency: ProgramResidency, program_id: str, body: dict[str, Any]) -> Any:
    return await residency.arrival(("pool", program_id), body, str(body).encode())


def store(residency: ProgramResidency, rank: str, seq: int, tokens: list[int]) -> None:
    """Rank ``rank`` announces ``tokens``' full blocks as one chain (engine hashes 1, 2, ...)."""
    n = len(tokens) // BS
    event = ["BlockStored", list(range(1, n + 1)), None, tokens[: n * BS], BS, None, "GPU"]
    residency.index.apply(rank, seq, 0.0, [event], now=1e12)


def test_a_short_prompt_is_kept_whole_and_a_long_one_sampled() -> None:
    keys = chain_keys(list(range(40 * BS)), BS)
    assert PromptSample.of(keys) == PromptSample(tuple(range(40)), tuple(keys))
    long_keys = chain_keys(list(range(1000 * BS)), BS)
    sample = PromptSample.of(long_keys)
    assert len(sample.keys) == SAMPLED_BLOCKS and sample.positions[-1] == 999 and sample.blocks == 1000
    assert sample.keys == tuple(long_keys[i] for i in sample.positions)


async def test_reports_say_what_each_known_rank_holds() -> None:
    residency = shell()
    prompt = list(range(100, 100 + 10 * BS + 2))  # 10 full blocks and 2 tokens
    assert await arrive(residency, "a", {"prompt": prompt}) == (10 * BS, {})  # unknown Ranks
    store(residency, RANKS[0].id, 0, prompt[: 6 * BS])
    store(residency, RANKS[1].id, 0, [7] * BS)
    assert residency.report(RANKS) == {("pool", "a"): (10 * BS, {RANKS[0].id: 6 * BS, RANKS[1].id: 0})}
    assert (
        await arrive(residency, "b", {"messages": [{"role": "user", "content": "x"}]}) is None
    )  # no tokenizer


async def test_a_long_prompt_reports_down_to_the_last_sampled_block_held() -> None:
    residency = shell()
    prompt = list(range(1000 * BS))
    await arrive(residency, "a", {"prompt": prompt})
    store(residency, RANKS[0].id, 0, prompt[: 500 * BS])
    [(covered, held)] = residency.report(RANKS[:1]).values()
    assert covered == 1000 * BS
    assert 500 * BS - 1000 * BS // SAMPLED_BLOCKS <= held[RANKS[0].id] <= 500 * BS


async def test_remembered_programs_are_bounded() -> None:
    residency = shell(max_paused_programs=2, max_pooled_requests=1)
    for i in range(5):
        await arrive(residency, f"p{i}", {"prompt": [1] * BS})
    assert list(residency.report(RANKS)) == [("pool", "p2"), ("pool", "p3"), ("pool", "p4")]


class ThreadRecording(PromptTokenizer):
    """The tiny model's tokenizer, noting which thread each encode ran on."""

    threads: list[int]

    def encode_text(self, text: str) -> list[int]:
        self.threads.append(threading.get_ident())
        return super().encode_text(text)

    def encode_chat(self, messages: Sequence[Any], tools: Any = None) -> list[int]:
        self.threads.append(threading.get_ident())
        return super().encode_chat(messages, tools)


async def test_text_and_chat_prompts_are_matched_through_the_tokenizer_long_ones_off_the_loop(
    tmp_path: Path,
) -> None:
    loaded = PromptTokenizer.load(str(write_tiny_tokenizer(tmp_path / "model")))
    tokenizer = ThreadRecording(loaded._tokenizer, loaded.chat_template, {"bos_token": "<s>"})
    tokenizer.threads = []
    residency = shell(tokenizer)
    short = [{"role": "user", "content": "w1 w2 w3 w4 w5 w6 w7 w8"}]
    ids = tokenizer.encode_chat(short)
    store(residency, RANKS[1].id, 0, ids)
    covered = len(ids) // BS * BS
    reported = await arrive(residency, "chat", {"messages": short})
    assert reported == (covered, {RANKS[1].id: covered})  # Rank 0 is not heard yet: unknown
    chat_thread = tokenizer.threads[-1]
    text = " ".join(f"w{i % 500}" for i in range(OFFLOAD_BYTES))  # a body over OFFLOAD_BYTES
    text_ids = tokenizer.encode_text(text)
    store(residency, RANKS[0].id, 0, text_ids[: 8 * BS])
    report = await arrive(residency, "text", {"prompt": text})
    assert report == (len(text_ids) // BS * BS, {RANKS[0].id: 8 * BS, RANKS[1].id: 0})
    loop_thread = threading.get_ident()
    assert chat_thread == loop_thread  # the short chat was tokenized inline
    assert tokenizer.threads[-1] != loop_thread  # the long text in a worker thread
