#!/usr/bin/env bash
# One device-machine call for issue 10: the GPU tests with CUDA and NCCL required, then
# rounds of kiln's conv suite on the four small-channel problems (TF32 and bf16) beside
# PyTorch's conv suite, compared. Carry the bundle as .gpucarry (see bench/gpu_run.sh).
#   (device tool) carry [".gpucarry"], command: bash bench/gpu_conv_rounds.sh [ROUNDS]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source bench/gpu_env.sh
run_tests 300
export KILN_BENCH_CONV=b32-32x64-28-k3,b1-3x64-224-k3,b256-1x32-28-k5,b256-32x64-14-k5
export KILN_BENCH_CONV_PRECISIONS=tf32,bf16
for r in $(seq 1 "${1:-2}"); do
  KILN_CUDNN_LOG=1 timeout 150 .gpu/bin/kiln bench run --device cuda --suite conv --out "$OUT/kiln_conv$r.json" > "$OUT/choices$r.txt" 2>&1
  echo "kiln conv round $r exit $?"
  timeout 200 python3 bench/torch_bench.py --device cuda --suite conv --out "$OUT/torch_conv$r.json" > /dev/null 2>&1
  echo "torch conv round $r exit $?"
  .gpu/bin/kiln bench compare "$OUT/kiln_conv$r.json" "$OUT/torch_conv$r.json" > "$OUT/compare$r.txt"
  grep -E "32x64-14-k5|32x64-28-k3|3x64-224|1x32-28" "$OUT/compare$r.txt" | sed -E 's/ +/ /g'
done
