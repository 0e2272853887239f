#!/usr/bin/env bash
# One device-machine call: unpack the bundle, run every test with CUDA required, then the
# kiln and PyTorch benchmarks and their comparison. Logs and JSON go to $OUT.
#   (here) ../shared/tools/gpu-bundle --bins && tar -cf - .gpu | xz -T2 > .gpucarry/gpu.tar.xz
#   (device tool) carry [".gpucarry"], command: bash bench/gpu_run.sh [tests|bench|all]
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d .gpu ] || xz -dc .gpucarry/gpu.tar.xz | tar -xf -
export KILN_KERNEL_CACHE=/tmp/kiln-kernels
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
export KILN_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ "$what" = all ] || [ "$what" = tests ]; then
  timeout 300 bash .gpu/run-tests.sh > "$OUT/tests.log" 2>&1; echo "tests exit $?"
  grep -E "^test result|FAILED|panicked|^test executables" "$OUT/tests.log" | tail -40
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
  timeout 200 .gpu/bin/kiln bench run --device cuda --out "$OUT/kiln_h100.json" > "$OUT/kiln_bench.log" 2>&1; echo "kiln bench exit $?"
  timeout 200 python3 bench/torch_bench.py --device cuda --out "$OUT/torch_h100.json" > "$OUT/torch_bench.log" 2>&1; echo "torch bench exit $?"
  tail -3 "$OUT/torch_bench.log"
  .gpu/bin/kiln bench compare "$OUT/kiln_h100.json" "$OUT/torch_h100.json" | tee "$OUT/compare.txt"
fi
