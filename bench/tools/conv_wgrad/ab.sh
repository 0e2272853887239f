#!/usr/bin/env bash
# Device-machine call: an earlier version of the weight-gradient kernel (prev/, ignored by
# git: `git show REV:crates/kiln/src/backend/cuda/kernels/conv_wgrad_mma.cu >
# bench/tools/conv_wgrad/prev/conv_wgrad_mma.cu`, carried with the run's `carry`) against the
# working tree's, 320 threads × 1 block, on the CNN's problems: the kernel alone, with the
# partials' sum, and with the bias gradient too, each checked against an f64 reference.
#   bash bench/tools/conv_wgrad/ab.sh
set -u
NV=/usr/local/cuda/bin/nvcc
I=crates/kiln/src/backend/cuda/kernels
D=bench/tools/conv_wgrad
flags="-arch=sm_90a -O3 -std=c++17 -lineinfo -DWGRAD_MMA_THREADS=320 -DWGRAD_MMA_BLOCKS=1"
$NV $flags -I $D/prev -I $I $D/bench.cu -o /tmp/wg_prev 2>&1 | grep -i "error" | head
$NV $flags -I $I $D/bench.cu -o /tmp/wg_new 2>&1 | grep -i "error" | head
for prob in "256 32 64 14 14 5 5 2 2 66" "32 32 64 28 28 3 3 1 2 66"; do
  for v in prev new prev new; do echo "== $v"; /tmp/wg_$v $prob | grep -v "^problem"; done
done
