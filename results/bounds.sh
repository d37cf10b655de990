#!/bin/bash
# retention_bound.py beside each finished point (the oracle arm's mean latency), once.
cd /work/wt/h29-ttl/bench
for spec in "8b24 h200-llama-8b 24 3" "32b6 h200-qwen-32b 6 8" "32b2 h200-qwen-32b 2 8" "32b4 h200-qwen-32b 4 8" "32b4even h200-qwen-32b 4 8" "32b11 h200-qwen-32b 11 8" "8b12 h200-llama-8b 12 3" "8b16 h200-llama-8b 16 3" "8b16even h200-llama-8b 16 3" "8b32 h200-llama-8b 32 3"; do
  set -- $spec; name=$1 prof=$2 apr=$3 res=$4
  seeds=0,1,2,3,4; [ $name = 8b32 ] && seeds=0,1
  [ -s ../results/bound_$name.log ] && continue
  while [ ! -f ../results/full_$name/sweep.json ]; do sleep 20; done
  OL=$(../.venv/bin/python -c "import json;r=[x for x in json.load(open('../results/full_$name/sweep.json')) if x['arm']=='oracle'][0];print(round(r['request_seconds_mean'],2))")
  bench=retention_bound.py
  nice -n 15 ../.venv/bin/python $bench --profile $prof --agents-per-rank $apr --seeds $seeds --reserve $res --oracle-latency $OL > ../results/bound_$name.log 2>&1
done
