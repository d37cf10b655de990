"""Mean TTL-rule bound latency from a retention_bound log, and the share of native->bound latency gap each arm closes."""
import json, re, statistics, sys
log, sweep = sys.argv[1], sys.argv[2]
ttl = [float(l.split("|")[4]) for l in open(log) if "| TTL rule |" in l]
knows = [float(l.split("|")[4]) for l in open(log) if "| knows each gap |" in l]
fits = [float(m.group(1)) for m in re.finditer(r"run as many as fit \(([\d.]+) per Rank", open(log).read())]
rows = {r["arm"]: r for r in json.load(open(sweep))}
b = statistics.fmean(ttl); n = rows["native"]["request_seconds_mean"]
apr = next(iter(rows.values()))["agents_per_rank"]
print(f"{sweep}: TTL-rule bound {b:.2f} s (knows-each-gap {statistics.fmean(knows):.2f} s); contexts that fit a Rank {statistics.fmean(fits):.1f} -> working set {apr/statistics.fmean(fits):.1f}x KV")
for arm, r in rows.items():
    if arm in ("native", "oracle"): continue
    print(f"  {arm}: latency {r['request_seconds_mean']:.1f} s, gap closed {(n - r['request_seconds_mean'])/(n - b):.2f}")
