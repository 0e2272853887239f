#!/usr/bin/env bash
# Device-machine call: build bench.cu for each launch bound and run it on the given problems,
# beside PyTorch (bench.py). Usage: bash bench/tools/conv_wgrad/run.sh
set -u
NV=/usr/local/cuda/bin/nvcc
I=crates/kiln/src/backend/cuda/kernels
for b in "160 3" "320 1"; do
  set -- $b
  $NV -arch=sm_90a -O3 -std=c++17 -I $I -DWGRAD_MMA_THREADS=$1 -DWGRAD_MMA_BLOCKS=$2 bench/tools/conv_wgrad/bench.cu -o /tmp/wg$1 2>&1 | grep -v "declared but never\|^$\|Remark" | head -20
done
for prob in "256 32 64 14 14 5 5 2" "32 32 64 28 28 3 3 1" "64 64 64 56 56 3 3 1"; do
  /tmp/wg160 $prob 1
  /tmp/wg320 $prob 2
  python3 bench/tools/conv_wgrad/bench.py $prob
done
