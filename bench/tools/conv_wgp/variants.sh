#!/usr/bin/env bash
# Builds of the persistent convolution's harness with different flags, compiled in parallel and
# run one after the other, ROUNDS rounds each: VARIANTS="name:-DFLAG=1,-DOTHER=2 name2:".
#   OUT=dir VARIANTS=... bash bench/tools/conv_wgp/variants.sh [ROUNDS]
set -uo pipefail
ROUNDS=${1:-1}
for v in $VARIANTS; do
  n=${v%%:*}; f=$(echo "${v#*:}" | tr , ' ')
  (nvcc -arch=sm_90a -O3 -std=c++17 $f -I crates/kiln/src/backend/cuda/kernels -I bench/tools/conv_wgp bench/tools/conv_wgp/harness.cu \
     -o /tmp/wgp_$n > $OUT/nvcc_$n.log 2>&1 || echo "$n: nvcc failed") &
done
wait
for v in $VARIANTS; do
  n=${v%%:*}
  echo "#### $n"
  timeout 200 /tmp/wgp_$n "$ROUNDS" 2>&1 | tee $OUT/wgp_$n.log
done
