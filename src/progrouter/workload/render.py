"""The benchmark report for people: a rich table in the terminal and PNG plots (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from progrouter.workload.report import figure, ratio

#: (label, figure path, format, compare to the baseline)
ROWS: tuple[tuple[str, str, str, bool], ...] = (
    ("completed tasks", "completed_tasks", "int", False),
    ("JCT mean s", "jct_seconds.mean", "s", True),
    ("JCT p50 s", "jct_seconds.p50", "s", True),
    ("JCT p90 s", "jct_seconds.p90", "s", True),
    ("TTFT p50 s", "ttft_seconds.p50", "s", True),
    ("TTFT p99 s", "ttft_seconds.p99", "s", True),
    ("e2e p50 s", "e2e_seconds.p50", "s", True),
    ("e2e p99 s", "e2e_seconds.p99", "s", True),
    ("requests/s", "requests_per_second", "f", True),
    ("output tok/s", "output_tokens_per_second", "f", True),
    ("token cache hit", "token_cache_hit", "pct", True),
    ("queue wait p50 s", "queue_wait.p50", "s", False),
    ("queue wait p90 s", "queue_wait.p90", "s", False),
    ("cross-Rank resumes", "transitions.cross_rank_resume", "int", False),
    ("force resumes", "transitions.force_resume", "int", False),
    ("segment yields", "transitions.max_segment_yield", "int", False),
    ("TTL expiries", "transitions.ttl_expired", "int", False),
    ("preemptions", "preemptions", "int", False),
    ("input tokens", "input_tokens", "int", False),
    ("output tokens", "output_tokens", "int", False),
    ("errors", "errors", "int", False),
)


def _fmt(v: float | None, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "pct":
        return f"{100 * v:.1f}%"
    if kind == "int":
        return f"{v:,.0f}"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def summary_table(report: Mapping[str, Any], baseline: str = "native") -> Table:
    arms: Mapping[str, Mapping[str, Any]] = report["arms"]
    table = Table(title="progrouter bench (modelled seconds; × = ratio to native)")
    table.add_column("figure")
    for name in arms:
        table.add_column(name, justify="right")
    base = arms.get(baseline)
    for label, path, kind, rel in ROWS:
        cells = []
        for name, figs in arms.items():
            v = figure(figs, path)
            cell = _fmt(v, kind)
            r = ratio(v, figure(base, path)) if base is not None and rel and name != baseline else None
            if r is not None:
                cell += f" ({r:.2f}×)"
            cells.append(cell)
        table.add_row(label, *cells)
    table.add_row(
        "queue wait from", *[str(f.get("queue_wait", {}).get("source", "-")) for f in arms.values()]
    )
    gap = [report["comparison"].get(n, {}).get("jct_gap_closed") for n in arms]
    table.add_row("native→oracle JCT gap closed", *[_fmt(g, "pct") for g in gap])
    return table


def rank_table(report: Mapping[str, Any]) -> Table:
    table = Table(title="load per Rank (requests, prompt tokens, token cache hit)")
    table.add_column("arm")
    table.add_column("Rank")
    table.add_column("requests", justify="right")
    table.add_column("prompt tokens", justify="right")
    table.add_column("share of prompt tokens", justify="right")
    table.add_column("cache hit", justify="right")
    for name, figs in report["arms"].items():
        ranks = figs.get("ranks", [])
        total = sum(r["prompt_tokens"] for r in ranks) or 1.0
        engines: dict[str, int] = {}
        for r in ranks:
            url, _, rank = str(r["rank"]).rpartition("@")
            label = f"engine {engines.setdefault(url, len(engines))} Rank {rank}"
            table.add_row(
                name,
                label,
                _fmt(r["requests"], "int"),
                _fmt(r["prompt_tokens"], "int"),
                _fmt(r["prompt_tokens"] / total, "pct"),
                _fmt(r["token_cache_hit"], "pct"),
            )
    return table


def print_report(report: Mapping[str, Any], console: Console, report_dir: Path | None = None) -> None:
    console.print(summary_table(report))
    console.print(rank_table(report))
    if report.get("program_config") is not None:
        import orjson

        console.print(f"program arm config: {orjson.dumps(report['program_config']).decode()}")
    if report_dir is not None:
        console.print(f"report: {report_dir / 'report.json'}; plots: {report_dir}/*.png")


def plot(report: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """JCT distribution, token cache hit and queue wait per arm, as PNG files in ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms: Mapping[str, Mapping[str, Any]] = report["arms"]
    names = list(arms)
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4))
    for name in names:
        values = sorted(arms[name].get("jct_per_task", {}).values())
        if values:
            ys = [(i + 1) / len(values) for i in range(len(values))]
            ax.step(values, ys, where="post", label=name)
    ax.set_xlabel("job completion time per task (modelled s)")
    ax.set_ylabel("share of tasks")
    ax.set_title("JCT distribution per arm")
    ax.legend()
    ax.grid(alpha=0.3)
    paths.append(_save(fig, out_dir / "jct.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    hits = [100 * (figure(arms[n], "token_cache_hit") or 0.0) for n in names]
    ax.bar(names, hits, color="tab:green")
    for i, h in enumerate(hits):
        ax.text(i, h + 1, f"{h:.1f}%", ha="center")
    ax.set_ylim(0, 105)
    ax.set_ylabel("token cache hit (%)")
    ax.set_title("Δ prompt_tokens_cached / Δ prompt_tokens")
    paths.append(_save(fig, out_dir / "cache_hit.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.38
    xs = range(len(names))
    p50 = [figure(arms[n], "queue_wait.p50") or 0.0 for n in names]
    p90 = [figure(arms[n], "queue_wait.p90") or 0.0 for n in names]
    ax.bar([x - width / 2 for x in xs], p50, width, label="p50")
    ax.bar([x + width / 2 for x in xs], p90, width, label="p90")
    ax.set_xticks(list(xs), [f"{n}\n({_short(arms[n])})" for n in names])
    ax.set_ylabel("queue wait (modelled s)")
    ax.set_title("router queue wait")
    ax.legend()
    paths.append(_save(fig, out_dir / "queue_wait.png"))
    return paths


def _short(figs: Mapping[str, Any]) -> str:
    source = str(figs.get("queue_wait", {}).get("source", ""))
    return "router" if source.startswith("router") else "replay est."


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
