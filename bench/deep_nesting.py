"""What a deeply nested request costs the router's text walk: ``routing_text`` time per nesting level.

A client controls how deep ``messages[].content`` nests. The walk keeps its own stack, so the cost per level
should stay flat as the depth grows 1,000-fold (linear time) and no depth raises ``RecursionError``. Prints,
for each depth, the best of ``--repeat`` runs and the time per level, for lists of parts and for nested part
objects.

    .venv/bin/python bench/deep_nesting.py
    .venv/bin/python bench/deep_nesting.py --depths 1000 1000000 --repeat 3
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from progrouter.routing.request_text import routing_text


def nested(depth: int, shape: str) -> dict[str, Any]:
    value: Any = "leaf"
    for i in range(depth):
        value = [value, f"w{i}"] if shape == "list" else {"type": "text", "content": value, "text": f"w{i}"}
    return {"messages": [{"role": "user", "content": value}]}


def best_of(body: dict[str, Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        routing_text(body)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000])
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    print(f"{'shape':>6} {'depth':>10} {'seconds':>10} {'ns/level':>10}")
    for shape in ("list", "part"):
        for depth in args.depths:
            seconds = best_of(nested(depth, shape), args.repeat)
            print(f"{shape:>6} {depth:>10} {seconds:>10.4f} {seconds / depth * 1e9:>10.0f}")


if __name__ == "__main__":
    main()
