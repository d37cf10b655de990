"""Markdown rows for docs/benchmarks/fleet.md from full_<point>/sweep.json and bound_<point>.log."""
import json, re, statistics, sys
from pathlib import Path

POINTS = [("8b12", "8B, 12 (hashed)"), ("8b16", "8B, 16 (hashed)"), ("8b16even", "8B, 16 (even)"),
          ("8b24", "**8B, 24 (collapse)**"), ("8b32", "8B, 32 (heavy)"), ("32b2", "32B, 2 (hashed)"),
          ("32b4", "32B, 4 (hashed)"), ("32b4even", "32B, 4 (even)"), ("32b6", "**32B, 6 (collapse)**"),
          ("32b11", "32B, 11 (heavy)")]
EXTRA = {"32b2": "32b2ch", "32b4": "32b4ch", "32b4even": "32b4evench"}

def rows_of(name):
    p = Path(f"full_{name}/sweep.json")
    return {r["arm"]: r for r in json.loads(p.read_text())} if p.exists() else None

def bound(name):
    p = Path(f"bound_{name}.log")
    if not p.exists():
        return None, None
    text = p.read_text()
    ttl = [float(l.split("|")[4]) for l in text.splitlines() if "| TTL rule |" in l]
    fits = [float(m.group(1)) for m in re.finditer(r"as many as fit \(([\d.]+) per Rank", text)]
    return (statistics.fmean(ttl) if ttl else None), (statistics.fmean(fits) if fits else None)

def cell(r, native, oracle, b):
    closed = (native["request_seconds_mean"] - r["request_seconds_mean"]) / (native["request_seconds_mean"] - b) if b else None
    s = (f"{r['x_native']:.3f} / {r['jct_x_native']:.3f} ({r['jct_little'] / oracle['jct_little']:.2f}), {r['token_hit']:.3f}"
         if oracle else f"{r['x_native']:.3f} / {r['jct_x_native']:.3f}, {r['token_hit']:.3f}")
    if closed is not None:
        s += f"; {closed:.2f}"
    return s

print("| load: profile, agents per GPU (placement) | working set × KV | native hit, latency | recommended: latency × native / JCT × native (× oracle), hit; gap closed | the same with `consistent_hash` | oracle JCT × native | TTL-rule bound latency × native | recommended: queue wait, TTL expiries, force resumes, preemptions (native's) |")
print("|---|---:|---|---|---|---:|---:|---|")
for name, label in POINTS:
    rows = rows_of(name)
    if rows is None:
        print(f"| {label} | | not measured | | | | | |"); continue
    native, oracle = rows["native"], rows.get("oracle")
    b, fits = bound(name)
    apr = native["agents_per_rank"]
    ws = f"{apr / fits:.1f}" if fits else ""
    rec = rows.get("rec")
    ch = rows.get("adch")
    if ch is None and name in EXTRA and rows_of(EXTRA[name]):
        ch = rows_of(EXTRA[name])["adch"]
    ch_cell = cell(ch, native, oracle if name not in EXTRA else None, b) if ch else "–"
    if ch and name in EXTRA and rows_of(EXTRA[name]):  # its own native run (same traces): ratios are to it
        ch_cell = f"{ch['x_native']:.3f} / {ch['jct_x_native']:.3f}, {ch['token_hit']:.3f}"
    mech = (f"{rec['queue_wait_mean']:.1f} s, {rec['ttl_expired']:.0f}, {rec['force_resume']:.1f}, {rec['preemptions']:.0f} ({native['preemptions']:.0f})")
    print(f"| {label} | {ws} | {native['token_hit']:.3f}, {native['request_seconds_mean']:.1f} s | {cell(rec, native, oracle, b)} | {ch_cell} | "
          f"{oracle['jct_x_native']:.3f} | {(b / native['request_seconds_mean']) if b else float('nan'):.3f} | {mech} |")
