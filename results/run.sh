#!/bin/bash
# run.sh NAME PROFILE APR SEEDS ARMS [extra args...]  -> results/NAME.log (quick iteration runs)
name=$1; prof=$2; apr=$3; seeds=$4; arms=$5; shift 5
res=3; [ "$prof" = h200-qwen-32b ] && res=8
cd /work/wt/h29-ttl/results
nice ../.venv/bin/python ../bench/${BENCH:-fleet_sim.py} --profile $prof --ranks 4 --hours 2 --warmup-hours 2 --reserve $res --jobs 1 \
  --seeds $seeds --agents-per-rank $apr --arms $arms "$@" > $name.log 2>&1
