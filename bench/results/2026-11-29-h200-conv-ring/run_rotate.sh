#!/bin/bash
# Rotated group order: the present kernel (WG_ROTATE 0/1) and the ring (1-tap groups, rotated).
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
K=crates/kiln/src/backend/cuda/kernels
nvidia-smi --query-gpu=name --format=csv,noheader
nvcc -arch=sm_90a -O3 -std=c++17 -DWG_ROTATE=0 -I $K bench/tools/conv_wgmma/harness.cu -o /tmp/rot0 2>/dev/null &
nvcc -arch=sm_90a -O3 -std=c++17 -DWG_ROTATE=1 -I $K bench/tools/conv_wgmma/harness.cu -o /tmp/rot1 2>/dev/null &
nvcc -arch=sm_90a -O3 -std=c++17 -I scratch_ring -I $K scratch_ring/harness_ring.cu -o /tmp/ring 2>/dev/null &
wait; ls /tmp/rot0 /tmp/rot1 /tmp/ring
echo "== correctness, rotated"; timeout 120 /tmp/rot1 12 4 2>&1 | grep -E "checked|harness|fused prep" | sed -E 's/\| mma flat.*//' | tee $OUT/rot1_all.log
for r in 1 2 3; do for b in rot0 rot1; do
  echo "== $b round $r"; timeout 60 /tmp/$b 12 1 "" 0 2>&1 | grep -E "one call|again|b256"
done; done 2>&1 | tee $OUT/rot.log
for r in 1 2; do for t in 1 2 3; do
  echo "== ring rotated tps $t round $r"; WS_TPS=$t timeout 60 /tmp/ring 12 1 tf32 -1 ws 2>&1 | grep -E "b256|harness"
done; done 2>&1 | tee $OUT/ring_rot.log
