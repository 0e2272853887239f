#!/usr/bin/env bash
# Device-machine call: one launch of the weight-gradient kernel (G=2, whole images, 66
# parts) under ncu, with its per-instruction SASS counters in $OUT/sass.csv.
set -u
NV=/usr/local/cuda/bin/nvcc
I=crates/kiln/src/backend/cuda/kernels
$NV -arch=sm_90a -O3 -std=c++17 -lineinfo -I $I -DWGRAD_MMA_THREADS=320 -DWGRAD_MMA_BLOCKS=1 bench/tools/conv_wgrad/bench.cu -o /tmp/wg320 2>/dev/null
ncu --kernel-name conv_wgrad_mma4x5_f32 --launch-count 1 --set full -o /tmp/rep /tmp/wg320 256 32 64 14 14 5 5 2 2 66 > /dev/null 2>&1
ncu -i /tmp/rep.ncu-rep --page details --print-details all > $OUT/details.txt 2>&1
ncu -i /tmp/rep.ncu-rep --page source --csv --print-source sass > $OUT/sass.csv 2>&1
ls -la $OUT; head -3 $OUT/sass.csv | cut -c1-600
