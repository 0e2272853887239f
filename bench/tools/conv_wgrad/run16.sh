#!/usr/bin/env bash
# Device-machine call: the 16-bit-input weight gradient experiment (wgrad16.cu) beside kiln's
# TF32 kernel (bench.cu) and PyTorch's cuDNN weight gradient in f32 (TF32) and bf16.
#   bash bench/tools/conv_wgrad/run16.sh
set -u
NV=/usr/local/cuda/bin/nvcc
I=crates/kiln/src/backend/cuda/kernels
D=bench/tools/conv_wgrad
flags="-arch=sm_90a -O3 -std=c++17 -I $I -DWGRAD_MMA_THREADS=320 -DWGRAD_MMA_BLOCKS=1"
$NV $flags $D/wgrad16.cu -o /tmp/w16 2>&1 | grep -i "error" | head
$NV $flags $D/bench.cu -o /tmp/w32 2>&1 | grep -i "error" | head
prob="256 32 64 14 14 5 5 2 2"
for round in 1 2; do
  /tmp/w16 $prob 66
  /tmp/w32 $prob 66 | grep -v "^problem" | head -1
done
python3 $D/bench.py 256 32 64 14 14 5 5 2
DTYPE=bfloat16 python3 $D/bench.py 256 32 64 14 14 5 5 2
