#!/bin/bash
# The rest of the tables, consistent_hash (adch) beside rec at every point, after the running point (pid $1).
while kill -0 $1 2>/dev/null; do sleep 5; done
echo "== 32b4even done $(date +%T)" >> /work/wt/h29-ttl/results/chain.progress
cd /tmp/h29_frozen
export PYTHONPATH=/tmp/h29_frozen/src
PY=/work/wt/h29-ttl/.venv/bin/python
OUT=/work/wt/h29-ttl/results
C='"token_capacity_per_dp_rank":"kv","global_queue":true'
AD='"acting_ttl_policy":"adaptive"'
REC="rec={$C,\"binding_strategy\":\"least_program_count\",$AD}"
ADCH="adch={$C,\"binding_strategy\":\"consistent_hash\",$AD}"
pt() { # name bench profile apr arms seeds variants...
  local name=$1 bench=$2 prof=$3 apr=$4 arms=$5 seeds=$6 res=3; shift 6
  [ "$prof" = h200-qwen-32b ] && res=8
  echo "== $name start $(date +%T)" >> $OUT/chain.progress
  nice $PY bench/$bench --profile $prof --ranks 4 --hours 2 --warmup-hours 2 --reserve $res --seeds $seeds --jobs 1 \
     --agents-per-rank $apr --arms $arms "$@" --out $OUT/full_$name > $OUT/full_$name.log 2>&1
  echo "== $name done $(date +%T)" >> $OUT/chain.progress
}
pt 32b11 fleet_sim.py h200-qwen-32b 11 native,oracle 0,1,2,3,4 --variant "$REC" --variant "$ADCH"
pt 8b12 fleet_sim.py h200-llama-8b 12 native,oracle 0,1,2,3,4 --variant "$REC" --variant "$ADCH"
pt 8b16 fleet_sim.py h200-llama-8b 16 native,oracle 0,1,2,3,4 --variant "$REC" --variant "$ADCH"
pt 8b16even even_placement.py h200-llama-8b 16 native,oracle 0,1,2,3,4 --variant "$REC" --variant "$ADCH"
pt 32b2ch fleet_sim.py h200-qwen-32b 2 native 0,1,2,3,4 --variant "$ADCH"
pt 32b4ch fleet_sim.py h200-qwen-32b 4 native 0,1,2,3,4 --variant "$ADCH"
pt 32b4evench even_placement.py h200-qwen-32b 4 native 0,1,2,3,4 --variant "$ADCH"
pt 8b32 fleet_sim.py h200-llama-8b 32 native,oracle 0,1 --variant "$REC" --variant "$ADCH"
