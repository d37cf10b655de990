"""Router CPU to tokenize a long prompt (kv_aware's ``--tokenizer``), and how long the event loop stalls.

Builds a ``--tokens``-token text (and a chat of it), encodes each ``--repeat`` times with the model's
tokenizer files (``--tokenizer``; default the vLLM tier's tiny Llama when it is built, else a word-level
tokenizer written to a temporary folder) and prints the median CPU time (process CPU, as the machine may be
shared) and wall time per encode; then the rest of a kv_aware decision on those ids (block keys, the match on
4 Ranks); then the longest event-loop stall while kv_aware's ``prepare`` handles the request (it tokenizes
and keys any body over ``OFFLOAD_BYTES`` in a worker thread), and the CPU of a body at that threshold.

    .venv/bin/python bench/tokenize_prompt.py
    .venv/bin/python bench/tokenize_prompt.py --tokenizer /path/to/model --tokens 100000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from progrouter.observe.kv_events import in_worker_thread
from progrouter.routing.kv_aware import OFFLOAD_BYTES, KvAwarePolicy, KvAwareSettings
from progrouter.routing.kv_residency import ResidencyIndex, chain_keys
from progrouter.routing.policies import CacheAwarePolicy, RoutingRequest
from progrouter.routing.prefix_tree import CacheAwareIndex
from progrouter.routing.tokenize import PromptTokenizer

TINY_LLAMA = Path.home() / ".cache" / "progrouter" / "tiny-llama"
WORDS = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "agents",
    "call",
    "tools",
)


def word_tokenizer(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", *WORDS])}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    template = "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return folder


def cost_ms(work: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median (process CPU, wall) milliseconds of ``work``."""
    cpu, wall = [], []
    for _ in range(repeat):
        c, w = time.process_time(), time.perf_counter()
        work()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return statistics.median(cpu) * 1e3, statistics.median(wall) * 1e3


def text_of(tok: PromptTokenizer, tokens: int) -> str:
    """Random words, cut to about ``tokens`` tokens of this tokenizer."""
    rng = random.Random(1)
    words = [rng.choice(WORDS) for _ in range(tokens)]
    per_word = len(tok.encode_text(" ".join(words[:2000]))) / 2000
    return " ".join(words[: int(tokens / per_word)])


async def loop_stall_ms(policy: KvAwarePolicy, request: RoutingRequest) -> tuple[float, float]:
    """(longest gap between 1 ms ticks, total) while ``prepare`` runs: what other requests would wait."""
    gaps: list[float] = []
    done = False

    async def tick() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.02)
    start = time.perf_counter()
    await policy.prepare(request)
    took = time.perf_counter() - start
    done = True
    await ticker
    return max(gaps) * 1e3, took * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default=None, help="model directory (default: tiny Llama, else words)")
    parser.add_argument("--tokens", type=int, default=100_000, help="about this many tokens")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.tokenizer or (str(TINY_LLAMA) if (TINY_LLAMA / "tokenizer.json").is_file() else None)
        tok = PromptTokenizer.load(path or str(word_tokenizer(Path(tmp))))
        text = text_of(tok, args.tokens)
        ids = tok.encode_text(text)
        messages = [{"role": "user", "content": text}]
        print(f"tokenizer {path or 'word-level'}: {len(text):,} characters = {len(ids):,} tokens")
        for name, work in (
            ("encode text", lambda: tok.encode_text(text)),
            ("encode chat (template + encode)", lambda: tok.encode_chat(messages)),
            ("block keys of the ids", lambda: chain_keys(ids, args.block_size)),
        ):
            cpu, wall = cost_ms(work, args.repeat)
            print(f"{name:34s} CPU {cpu:8.2f} ms   wall {wall:8.2f} ms")
        index = ResidencyIndex()
        keys = chain_keys(ids, args.block_size)
        stored = [
            "BlockStored",
            list(range(len(keys))),
            None,
            ids[: len(keys) * args.block_size],
            args.block_size,
        ]
        for rank in range(4):
            index.apply(rank, 0, 0.0, [[*stored, None, "GPU"]] if rank == 0 else [], 0.0)
        cpu, wall = cost_ms(lambda: [index.match(rank, keys) for rank in range(4)], args.repeat)
        print(f"{'match on 4 Ranks (one holds all)':34s} CPU {cpu:8.2f} ms   wall {wall:8.2f} ms")
        threshold = text[: OFFLOAD_BYTES - 20]
        cpu, wall = cost_ms(lambda: tok.encode_text(threshold), args.repeat * 20)
        label = f"{OFFLOAD_BYTES}-byte body (off-loop threshold)"
        print(f"{label:34s} CPU {cpu:8.3f} ms   wall {wall:8.3f} ms")
        policy = KvAwarePolicy(
            ResidencyIndex(),
            KvAwareSettings(args.block_size),
            tok,
            CacheAwarePolicy(CacheAwareIndex(1)),
            time.monotonic,
        )
        policy.offload = in_worker_thread  # as the router sets it
        for name, body in (("text", {"prompt": text}), ("token ids", {"prompt": ids})):
            raw = orjson.dumps(body)
            stall, took = asyncio.run(loop_stall_ms(policy, RoutingRequest({}, body, raw)))
            print(
                f"prepare({name}): {took:8.1f} ms in a worker thread; longest event-loop stall {stall:.1f} ms"
            )


if __name__ == "__main__":
    main()
