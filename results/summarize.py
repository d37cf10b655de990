"""Print each full_*/sweep.json point as table rows (ratios to native, JCT x oracle)."""
import json, sys
from pathlib import Path
for path in sys.argv[1:]:
    rows = json.loads(Path(path).read_text())
    by = {r["arm"]: r for r in rows}
    nat, orc = by.get("native"), by.get("oracle")
    print(f"## {path}: {rows[0]['profile']} {rows[0]['agents_per_rank']:g}/GPU, seeds {rows[0]['seeds']}")
    if nat:
        print(f"native: hit {nat['token_hit']:.3f}, latency {nat['request_seconds_mean']:.1f} s, JCT(Little) {nat['jct_little']:.0f} s, preempt {nat['preemptions']:.0f}")
    for arm, r in by.items():
        if arm == "native":
            continue
        xo = r["jct_little"] / orc["jct_little"] if orc else float("nan")
        print(f"{arm:9s} hit {r['token_hit']:.3f} | lat x nat {r['x_native']:.3f} ({r['request_seconds_mean']:.1f} s) | JCT x nat {r['jct_x_native']:.3f} | x oracle {xo:.3f} | "
              f"queue {r['queue_wait_mean']:.1f} s | force {r['force_resume']:.1f} cross {r['cross_rank_resume']:.1f} ttl_exp {r['ttl_expired']:.0f} repair {r['capacity_repair']:.0f} preempt {r['preemptions']:.0f} | per-seed lat x nat {[round(x,3) for x in r['per_seed_x_native']]}")
