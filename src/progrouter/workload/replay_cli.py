"""`progrouter replay --url URL --trace FILE --out facts.jsonl`: closed-loop replay with a progress bar.

Ctrl-C stops cleanly: in-flight requests are cancelled (and recorded as such), every finished request is
already in the facts file (it is written and flushed as each request ends).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from progrouter.workload import trace as trace_mod
from progrouter.workload.apis import API_NAMES
from progrouter.workload.apis.factory import check_hint
from progrouter.workload.facts import Fact, write_fact
from progrouter.workload.replay import ReplayOptions, ReplayResult, replay
from progrouter.workload.trace import Trace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="router or engine base URL, e.g. http://127.0.0.1:30000")
    parser.add_argument("--trace", type=Path, required=True, help="a progrouter trace (JSONL)")
    parser.add_argument("--out", type=Path, required=True, help="facts file to write (JSONL)")
    add_replay_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared with `progrouter bench`."""
    parser.add_argument(
        "--api",
        choices=list(API_NAMES),
        default="completions",
        help="completions: token-id prompts (exact prefixes, default); chat: text messages; "
        "messages: the Anthropic Messages API as Claude Code sends it; responses: the OpenAI Responses API "
        "as the Codex CLI sends it; chat-session: chat completions as OpenCode/OpenHands send them (these "
        "three: identity in the harness's headers, tool calls in the conversation)",
    )
    parser.add_argument("--model", default=None, help="model name (default: the first in /v1/models)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="the engines' --time-scale: trace gaps are waited gap/X wall seconds",
    )
    parser.add_argument("--max-connections", type=int, default=256)
    parser.add_argument("--max-concurrent-tasks", type=int, default=None, help="default: all tasks at once")
    parser.add_argument("--vocab-size", type=int, default=32_000, help="token ids stay below this")
    parser.add_argument(
        "--salt", default="progrouter", help="prompt content salt (change to avoid warm caches)"
    )
    parser.add_argument("--api-key", default=None, help="sent as Authorization: Bearer")
    parser.add_argument("--num-tasks", type=int, default=None, help="replay only the first N tasks")
    parser.add_argument(
        "--kv-retention-hint",
        type=float,
        default=None,
        metavar="SECONDS",
        help="every request asks the router to keep its KV this long (trace seconds) after it: "
        "kv_retention_ttl_seconds, as an agent that knows it is about to call a tool (default: none)",
    )


def options_from_args(args: argparse.Namespace, url: str) -> ReplayOptions:
    """The replay's options; ValueError for flags that do not go together."""
    check_hint(args.api, args.kv_retention_hint)
    return ReplayOptions(
        url=url.rstrip("/"),
        api=args.api,
        model=args.model,
        time_scale=args.time_scale,
        max_connections=args.max_connections,
        max_concurrent_tasks=args.max_concurrent_tasks,
        vocab_size=args.vocab_size,
        salt=args.salt,
        headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {},
        kv_retention_hint=args.kv_retention_hint,
    )


async def replay_to_file(
    trace: Trace, opts: ReplayOptions, out: Path, *, console: Console | None, stop: asyncio.Event
) -> ReplayResult:
    """Replay, writing each fact as it ends, with a progress bar on ``console`` (None: silent)."""
    with (
        open(out, "wb") as f,
        Progress(
            TextColumn("[bold]replay[/bold]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[errors]} errors"),
            TimeElapsedColumn(),
            console=console,
            disable=console is None,
        ) as progress,
    ):
        bar = progress.add_task("replay", total=trace.num_requests, errors=0)
        errors = 0

        def sink(fact: Fact) -> None:
            nonlocal errors
            write_fact(f, fact)
            errors += fact.status == "error"
            progress.update(bar, advance=1, errors=errors)

        return await replay(trace, opts, sink, stop)


async def _main(args: argparse.Namespace, console: Console) -> ReplayResult:
    trace = trace_mod.load(args.trace)
    if args.num_tasks is not None:
        trace = trace.head(args.num_tasks)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    opts = options_from_args(args, args.url)
    return await replay_to_file(trace, opts, args.out, console=None if args.quiet else console, stop=stop)


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    try:
        check_hint(args.api, args.kv_retention_hint)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    console.print(f"replay API: {args.api}")
    result = asyncio.run(_main(args, console))
    ok = sum(f.ok for f in result.facts)
    console.print(
        f"{'interrupted: ' if result.interrupted else ''}{ok}/{len(result.facts)} requests ok, "
        f"{len(result.task_end)} tasks ended, {result.wall_seconds:.1f} s; facts in {args.out}"
    )
    return 130 if result.interrupted else (0 if ok == len(result.facts) else 1)
