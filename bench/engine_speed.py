"""How fast the engine core simulates: modelled seconds per wall second for one Rank under saturating load.

Load: ``--requests`` requests (default 1,000) that all arrive at t=0 with ``--prompt-tokens``-token prompts
(default 8k); the first ``--shared-fraction`` of each prompt (default 50%) is one of ``--prefix-groups``
shared prefixes, the rest is unique. Prompts are built just in time (the waiting queue is kept topped up),
so memory stays flat while the core always has more work than room. Prints modelled and wall time, their
ratio, steps, and the wall cost of one step per running request.

    .venv/bin/python bench/engine_speed.py                  # default Rank: 8192 blocks x 16
    .venv/bin/python bench/engine_speed.py --num-blocks 65536  # a large KV cache: ~1M tokens, big batches
    .venv/bin/python bench/engine_speed.py --http --requests 200 --time-scale 200  # through HTTP + SSE

``--http`` sends the same load as streaming /v1/completions requests (token-id prompts, all at once) to an
in-process server (client and server share one core of the CPU) and reports how far the modelled clock fell
behind ``--time-scale`` (lag): the largest time scale a host sustains is where the lag stays near zero.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

from progrouter.engine import EngineConfig, EngineCore, SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--prompt-tokens", type=int, default=8192)
    p.add_argument("--shared-fraction", type=float, default=0.5)
    p.add_argument("--prefix-groups", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--num-blocks", type=int, default=8192)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--http", action="store_true", help="drive an in-process server over HTTP instead")
    p.add_argument("--time-scale", type=float, default=200.0, help="with --http")
    args = p.parse_args()
    if args.http:
        asyncio.run(bench_http(args))
        return

    config = EngineConfig(
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=min(args.num_blocks * args.block_size, 32768),
        seed=args.seed,
    )
    core = EngineCore(config)
    rng = np.random.default_rng(args.seed)
    shared_len = int(args.prompt_tokens * args.shared_fraction)
    prefixes = [rng.integers(3, 30000, shared_len).tolist() for _ in range(args.prefix_groups)]
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)

    added = 0
    build_wall = 0.0

    def top_up() -> None:
        nonlocal added, build_wall
        t0 = time.perf_counter()
        while added < args.requests and core.num_waiting < 32:
            suffix = rng.integers(3, 30000, args.prompt_tokens - shared_len).tolist()
            core.add_request(f"r{added}", prefixes[added % args.prefix_groups] + suffix, params, 0.0)
            added += 1
        build_wall += time.perf_counter() - t0

    steps = 0
    running_sum = 0
    step_wall = 0.0
    top_up()
    wall0 = time.perf_counter()
    while (t := core.next_event_time()) is not None:
        s0 = time.perf_counter()
        result = core.step(t)
        step_wall += time.perf_counter() - s0
        steps += 1
        running_sum += result.num_running
        top_up()
    wall = time.perf_counter() - wall0
    modelled = core._free_at
    st = core.stats
    print(
        f"config: {args.num_blocks} blocks x {args.block_size}, max_num_seqs {args.max_num_seqs}, "
        f"budget {args.max_num_batched_tokens} tokens/step"
    )
    print(
        f"load: {args.requests} requests x {args.prompt_tokens} prompt tokens "
        f"({args.shared_fraction:.0%} shared over {args.prefix_groups} prefixes), {args.max_tokens} out"
    )
    print(f"modelled seconds:           {modelled:12.1f}")
    print(f"wall seconds (core+feed):   {wall:12.2f}   of which prompt building {build_wall:.2f}")
    print(f"wall seconds (core steps):  {step_wall:12.2f}")
    print(f"speed (core steps only):    {modelled / step_wall:12.0f} x real time")
    print(f"speed (incl. feeding):      {modelled / wall:12.0f} x real time")
    print(
        f"steps: {steps}, mean running {running_sum / steps:.1f}, "
        f"wall per step {step_wall / steps * 1e6:.1f} us, "
        f"per running request {step_wall / max(running_sum, 1) * 1e6:.2f} us"
    )
    print(
        f"cache hit (tokens): {st.prompt_tokens_cached / max(st.prompt_tokens, 1):.1%}, "
        f"preemptions {st.num_preemptions}, generated {st.generation_tokens}"
    )


async def bench_http(args: argparse.Namespace) -> None:
    import aiohttp

    from progrouter.engine.server import start_engine

    config = EngineConfig(
        port=0,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=min(args.num_blocks * args.block_size, 32768),
        seed=args.seed,
        time_scale=args.time_scale,
    )
    rng = np.random.default_rng(args.seed)
    shared_len = int(args.prompt_tokens * args.shared_fraction)
    prefixes = [rng.integers(3, 30000, shared_len).tolist() for _ in range(args.prefix_groups)]
    prompts = [
        prefixes[i % args.prefix_groups] + rng.integers(3, 30000, args.prompt_tokens - shared_len).tolist()
        for i in range(args.requests)
    ]
    engine = await start_engine(config)
    core = engine.server.cores[0]
    max_lag = 0.0
    chunks = 0

    async def one(session: aiohttp.ClientSession, prompt: list[int]) -> None:
        nonlocal max_lag, chunks
        body = {"prompt": prompt, "max_tokens": args.max_tokens, "ignore_eos": True, "stream": True}
        async with session.post(engine.url + "/v1/completions", json=body) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    chunks += 1
                    if chunks % 1000 == 0:
                        lag = engine.server.model_time() - (
                            core.next_event_time() or engine.server.model_time()
                        )
                        max_lag = max(max_lag, lag)

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        wall0 = time.perf_counter()
        await asyncio.gather(*(one(session, p) for p in prompts))
        wall = time.perf_counter() - wall0
    modelled = core.stats.busy_seconds
    await engine.stop()
    print(
        f"http: {args.requests} streaming requests x {args.prompt_tokens} tokens, {args.max_tokens} out, "
        f"time scale {args.time_scale}"
    )
    print(
        f"modelled busy seconds {modelled:.1f}, wall {wall:.2f} s -> {modelled / wall:.0f} x real time; "
        f"{chunks} SSE chunks ({chunks / wall:.0f}/s); max model lag {max_lag:.2f} modelled s"
    )


if __name__ == "__main__":
    main()
