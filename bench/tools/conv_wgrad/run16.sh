#!/usr/bin/env bash
# Device-machine call: kiln's weight gradient on 16-bit inputs (bench.cu with DTYPE=bf16 and
# f16) beside its TF32 form and PyTorch's cuDNN weight gradient in f32 (TF32) and bf16.
#   bash bench/tools/conv_wgrad/run16.sh
set -u
NV=/usr/local/cuda/bin/nvcc
I=crates/kiln/src/backend/cuda/kernels
D=bench/tools/conv_wgrad
$NV -arch=sm_90a -O3 -std=c++17 -I $I -DWGRAD_MMA_THREADS=320 -DWGRAD_MMA_BLOCKS=1 $D/bench.cu -o /tmp/wg320 2>&1 \
  | grep -i "error" | head
prob="256 32 64 14 14 5 5 2 2"
for round in 1 2; do
  for dt in bf16 f16 f32; do DTYPE=$dt /tmp/wg320 $prob 66 | grep -v " bh \| b256 "; done
done
python3 $D/bench.py 256 32 64 14 14 5 5 2
DTYPE=bfloat16 python3 $D/bench.py 256 32 64 14 14 5 5 2
