#!/usr/bin/env bash
# A/B of kiln's tensor-core convolution kernels on the device: the harness built against
# bench/tools/conv_wgmma/prev/conv_mma.cu (an earlier kernels file, put there by hand, e.g.
# `git show REV:crates/kiln/src/backend/cuda/kernels/conv_mma.cu > .../prev/conv_mma.cu`, and
# carried; from b567cde on, when mma.cuh left conv_mma.cu: an older file redefines its helpers)
# and against the working tree's, run alternately ROUNDS times (default 3) on the
# b256 32→64 14² 5×5 forward (problem 0) and its input gradient's shape (problem 4), in TF32
# and bf16, warpgroup kernel of WARPS warps (default 12) beside mma.sync's flat 6 warps.
#   OUT=dir bash bench/tools/conv_wgmma/ab.sh [ROUNDS] [WARPS]
set -uo pipefail
ROUNDS=${1:-3}; WARPS=${2:-12}
K=crates/kiln/src/backend/cuda/kernels
P=bench/tools/conv_wgmma/prev
mkdir -p /tmp/ab_prev && cp $K/*.cuh /tmp/ab_prev/ && cp $P/conv_mma.cu /tmp/ab_prev/
nvcc -arch=sm_90a -O3 -std=c++17 -I /tmp/ab_prev bench/tools/conv_wgmma/harness.cu -o /tmp/ab_old > $OUT/nvcc_old.log 2>&1 &
nvcc -arch=sm_90a -O3 -std=c++17 -I $K bench/tools/conv_wgmma/harness.cu -o /tmp/ab_new > $OUT/nvcc_new.log 2>&1 &
wait
for r in $(seq "$ROUNDS"); do
  for v in old new; do
    for pick in 0 4; do
      echo "== round $r $v problem $pick"
      timeout 120 /tmp/ab_$v "$WARPS" 5 "" "$pick" 2>&1 | grep -vE "^harness"
    done
  done
done > $OUT/ab.log
grep -E "^==|from idle|back to back|checked|differing" $OUT/ab.log | cut -c1-250
