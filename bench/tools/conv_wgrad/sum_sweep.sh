#!/usr/bin/env bash
# Device-machine call: the weight gradient's partials' sum (conv_wgrad_mma_sum_f32) built
# with each WGRAD_SUM_COLS (float4 columns a block of 256 threads; the rest of the block
# sums the parts in interleaved groups), on the CNN's problems: kernel alone, with the sum,
# with the bias, each checked against an f64 reference (bench.cu).
#   bash bench/tools/conv_wgrad/sum_sweep.sh
set -u
NV=/usr/local/cuda/bin/nvcc
I=crates/kiln/src/backend/cuda/kernels
D=bench/tools/conv_wgrad
COLS=${COLS:-64 32 16 8}
for c in $COLS; do
  $NV -arch=sm_90a -O3 -std=c++17 -I $I -DWGRAD_MMA_THREADS=320 -DWGRAD_MMA_BLOCKS=1 -DWGRAD_SUM_COLS=$c \
    $D/bench.cu -o /tmp/wgs$c 2>&1 | grep -i "error" | head
done
for prob in "256 32 64 14 14 5 5 2 2 66" "32 32 64 28 28 3 3 1 2 66"; do
  for round in 1 2; do
    for c in $COLS; do echo "== cols $c"; /tmp/wgs$c $prob | grep -v "^problem" | head -2; done
  done
done
