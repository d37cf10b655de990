#!/bin/bash
# The full 5-seed tables, from a frozen copy of the tree (/tmp/h29_frozen), one command after another.
cd /tmp/h29_frozen
export PYTHONPATH=/tmp/h29_frozen/src
PY=/work/wt/h29-ttl/.venv/bin/python
OUT=/work/wt/h29-ttl/results
C='"token_capacity_per_dp_rank":"kv","global_queue":true'
AD='"acting_ttl_policy":"adaptive"'
V=(--variant "rec={$C,\"binding_strategy\":\"least_program_count\",$AD}" --variant "adch={$C,\"binding_strategy\":\"consistent_hash\",$AD}")
pt() { # name bench profile apr arms
  local name=$1 bench=$2 prof=$3 apr=$4 arms=$5 res=3
  [ "$prof" = h200-qwen-32b ] && res=8
  echo "== $name start $(date +%T)" >> $OUT/chain.progress
  nice $PY bench/$bench --profile $prof --ranks 4 --hours 2 --warmup-hours 2 --reserve $res --seeds 0,1,2,3,4 --jobs 1 \
     --agents-per-rank $apr --arms $arms "${V[@]}" --out $OUT/full_$name > $OUT/full_$name.log 2>&1
  echo "== $name done $(date +%T)" >> $OUT/chain.progress
}
pt 8b24 fleet_sim.py h200-llama-8b 24 native,capacity,oracle
pt 32b6 fleet_sim.py h200-qwen-32b 6 native,capacity,oracle
pt 32b2 fleet_sim.py h200-qwen-32b 2 native,oracle
pt 32b4 fleet_sim.py h200-qwen-32b 4 native,oracle
pt 32b4even even_placement.py h200-qwen-32b 4 native,oracle
pt 8b12 fleet_sim.py h200-llama-8b 12 native,oracle
pt 8b16 fleet_sim.py h200-llama-8b 16 native,oracle
pt 8b16even even_placement.py h200-llama-8b 16 native,oracle
pt 32b8 fleet_sim.py h200-qwen-32b 8 native,oracle
pt 8b32 fleet_sim.py h200-llama-8b 32 native,oracle
