"""`progrouter top`: the dashboard in a terminal (for SSH sessions), refreshed in place on every push.

It reads the router's ``/dashboard/stream`` (the same bounded pushes the page reads) and renders them with
rich; nothing else of the router is imported, so it runs from any machine that can reach the router.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections import deque
from collections.abc import Iterable
from typing import Any

import aiohttp
import orjson
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

EVENTS_SHOWN = 12


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--url", default="http://127.0.0.1:30000", help="the router (or its Prometheus listener)")
    a("--api-key", default=os.environ.get("PROGROUTER_ADMIN_KEY"), help="admin key ($PROGROUTER_ADMIN_KEY)")
    a("--page", type=int, default=0, help="page of the Programs table (from 0)")
    a("--size", type=int, default=20, help="Programs per page")
    a("--state", choices=["running", "retained", "pooled"], default=None, help="only Programs in this state")
    a("--iterations", type=int, default=0, help="stop after this many updates (0: until interrupted)")


def _num(value: Any, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _pct(value: Any) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def render(push: dict[str, Any], events: Iterable[dict[str, Any]]) -> Group:
    """One screen: totals, a row per Rank, one page of Programs, the latest events."""
    if not push.get("enabled"):
        return Group(Text("Program scheduling is not enabled on this router"))
    counts = push["counts"]
    title = Text(
        f"{push['programs']:,} Programs: {counts['running']:,} running, {counts['retained']:,} retained, "
        f"{counts['pooled']:,} pooled · {push['retained_requests']:,} requests in the pool",
        style="bold",
    )
    ranks = Table(title="Ranks", expand=True)
    for column in (
        "Rank",
        "KV used / cap",
        "ledger",
        "vLLM KV",
        "run/ret/pool",
        "wait",
        "cache hit",
        "obs age",
    ):
        ranks.add_column(column)
    for r in push["ranks"]:
        age = _num(r["observation_age_seconds"], 1) + ("" if r["observation_fresh"] else " stale")
        ranks.add_row(
            r["target_id"],
            f"{_num(r['used_tokens'])} / {_num(r['capacity_tokens'])}",
            _num(r["ledger_tokens"]),
            _pct(r["vllm_kv_cache_usage"]),
            f"{r['running']}/{r['retained']}/{r['pooled_programs']}",
            _num(r["queue_wait_seconds"], 2),
            _pct(r["cache_hit_ratio"]),
            age,
        )
    page = push["page"]
    programs = Table(
        title=f"Programs (page {page['index'] + 1}/{page['pages']}, {page['total']:,})", expand=True
    )
    for column in ("Program", "state", "Rank", "context", "TTL left", "pooled", "age"):
        programs.add_column(column)
    for p in page["rows"]:
        programs.add_row(
            p["program"],
            p["state"],
            p["rank"] or "–",
            _num(p["context_tokens"]),
            _num(p["ttl_left_seconds"], 1),
            _num(p["pooled_requests"]),
            _num(p["age_seconds"], 1),
        )
    feed = Table(title="Scheduling events", expand=True, show_header=False)
    feed.add_column("event")
    for e in events:
        fields = " ".join(f"{k}={v}" for k, v in e.items() if k not in ("seq", "time", "event"))
        feed.add_row(f"{e['event']} {fields}")
    return Group(title, ranks, programs, feed)


async def watch(args: argparse.Namespace, console: Console) -> int:
    """Follow the stream until interrupted or ``args.iterations`` pushes; 1 when the router refuses."""
    params = {"page": str(args.page), "size": str(args.size), **({"state": args.state} if args.state else {})}
    headers = {} if not args.api_key else {"Authorization": f"Bearer {args.api_key}"}
    events: deque[dict[str, Any]] = deque(maxlen=EVENTS_SHOWN)
    seen = 0
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=30)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(args.url.rstrip("/") + "/dashboard/stream", params=params, headers=headers) as response,
    ):
        if response.status != 200:
            console.print(f"progrouter top: {response.status} {await response.text()}")
            return 1
        with Live(console=console, auto_refresh=False) as live:
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                push = orjson.loads(line[6:])
                events.extendleft(push.get("events", []))
                live.update(render(push, events), refresh=True)
                seen += 1
                if args.iterations and seen >= args.iterations:
                    break
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(watch(args, Console()))
    except KeyboardInterrupt:
        return 0
    except aiohttp.ClientError as exc:
        print(f"progrouter top: {exc}", file=sys.stderr)
        return 1
