#!/usr/bin/env bash
# The persistent convolution's harness on the device: build, then ROUNDS rounds (default 2);
# extra nvcc flags in FLAGS (e.g. FLAGS=-DWGP_PRODUCER_REGS=72).
#   OUT=dir bash bench/tools/conv_wgp/run.sh [ROUNDS]
set -uo pipefail
ROUNDS=${1:-2}
nvcc -arch=sm_90a -O3 -std=c++17 ${FLAGS:-} -I crates/kiln/src/backend/cuda/kernels -I bench/tools/conv_wgp bench/tools/conv_wgp/harness.cu \
  -o /tmp/wgp > $OUT/nvcc.log 2>&1 || { tail -20 $OUT/nvcc.log; exit 1; }
timeout 240 /tmp/wgp "$ROUNDS" 2>&1 | tee $OUT/wgp.log
