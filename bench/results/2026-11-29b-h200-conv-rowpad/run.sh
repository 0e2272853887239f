#!/bin/bash
# Band rows padded so ldmatrix's eight pixels keep distinct banks across an output-row wrap.
# As measured, conv_mma_row_pad began with `#ifdef NO_ROW_PAD return 0; #endif` (removed since).
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
K=crates/kiln/src/backend/cuda/kernels
nvcc -arch=sm_90a -O3 -std=c++17 -DNO_ROW_PAD -I $K bench/tools/conv_wgmma/harness.cu -o /tmp/pad0 2>/dev/null &
nvcc -arch=sm_90a -O3 -std=c++17 -I $K bench/tools/conv_wgmma/harness.cu -o /tmp/pad1 2>/dev/null &
wait; ls /tmp/pad0 /tmp/pad1
echo "== correctness, padded"; timeout 120 /tmp/pad1 12 4 2>&1 | grep -E "checked|harness|fused prep" | sed -E 's/\| mma flat.*//' | tee $OUT/pad1_all.log
for r in 1 2 3; do for b in pad0 pad1; do
  echo "== $b round $r"; timeout 60 /tmp/$b 12 2 2>&1 | grep -E "one call|b256|b32"
done; done 2>&1 | tee $OUT/pad.log
