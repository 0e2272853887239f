#!/bin/bash
# The staggered warpgroup kernels (conv_wgs*) against conv_wg* on the device machine: builds
# the harness with three leads in parallel, checks every problem, times the 14² 5×5 one, and
# runs compute-sanitizer's race and sync checks on the two odd problems.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
K=crates/kiln/src/backend/cuda/kernels
nvidia-smi --query-gpu=name --format=csv,noheader
for lead in 2 4 8; do
  nvcc -arch=sm_90a -O3 -std=c++17 -DWS_LEAD=$lead -I $K bench/tools/conv_wgmma/harness.cu -o /tmp/ws$lead 2>/dev/null &
done
wait
ls -la /tmp/ws*
timeout 120 /tmp/ws4 12 4 "" -1 ws 2>&1 | tee $OUT/ws4_all.log
for r in 1 2; do for lead in 2 4 8; do echo "lead $lead round $r"; timeout 60 /tmp/ws$lead 12 1 tf32 -1 ws 2>&1 | tail -4; done; done | tee $OUT/leads.log
timeout 60 /tmp/ws4 12 1 bf16 -1 ws 2>&1 | tail -4 | tee $OUT/bf16.log
for t in racecheck synccheck; do
  timeout 200 compute-sanitizer --tool $t /tmp/ws4 12 4 tf32 3 ws 2>&1 | tail -5
  timeout 200 compute-sanitizer --tool $t /tmp/ws4 12 4 tf32 2 ws 2>&1 | tail -5
done | tee $OUT/sanitizer.log
