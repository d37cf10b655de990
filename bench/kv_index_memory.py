"""Memory of the KV residency index per million resident blocks, and its event-apply rate.

Feeds ``--blocks`` blocks to one Rank as vLLM-shaped ``BlockStored`` batches (chains of ``--chain`` blocks
of ``--block-size`` tokens) and prints the heap the index holds (tracemalloc; the events are freed once
applied, so what stays is the index) and the blocks applied per second.

    .venv/bin/python bench/kv_index_memory.py
    .venv/bin/python bench/kv_index_memory.py --blocks 2000000 --chain 64
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from typing import Any

from progrouter.routing.kv_residency import ResidencyIndex


def batches(n_blocks: int, chain: int, block_size: int) -> list[list[list[Any]]]:
    out = []
    for c in range(0, n_blocks, chain):
        n = min(chain, n_blocks - c)
        tokens = [(c * 31 + i) % 50000 for i in range(n * block_size)]
        out.append([["BlockStored", list(range(c + 1, c + n + 1)), None, tokens, block_size, None, "GPU"]])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--chain", type=int, default=32, help="blocks per BlockStored")
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    index = ResidencyIndex(max_blocks=args.blocks)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    work = batches(args.blocks, args.chain, args.block_size)  # traced: the hashes the index keeps are in it
    work.reverse()
    t0 = time.perf_counter()
    seq = 0
    while work:
        index.apply("rank", seq, 0.0, work.pop(), now=0.0)  # each batch is freed once applied
        seq += 1
    elapsed = time.perf_counter() - t0
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    per_million = held / index.size() * 1_000_000
    print(f"blocks resident: {index.size():,}")
    print(f"index heap: {held / 2**20:.1f} MiB, {per_million / 2**20:.1f} MiB per million blocks")
    print(f"apply: {index.size() / elapsed:,.0f} blocks/s (under tracemalloc, which slows it)")


if __name__ == "__main__":
    main()
