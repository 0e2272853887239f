#!/usr/bin/env bash
# One device-machine call: unpack the bundle, run every test with CUDA required, the kiln and
# PyTorch benchmarks with their comparison, and `kiln train` beside PyTorch eager training.
#   (here) ../shared/tools/gpu-bundle --bins --data /usr/share/datasets/fashion-mnist
#          git rev-parse --short HEAD > .gpucarry/COMMIT; tar -cf - .gpu | xz -T2 > .gpucarry/gpu.tar.xz
#   (device tool) carry [".gpucarry"], command: bash bench/gpu_run.sh [tests|bench|train|dev|all]
#   dev: the train benchmark suite and `kiln train` only
# Results (at most 8 files) go to $OUT.
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d .gpu ] || xz -dc .gpucarry/gpu.tar.xz | tar -xf -
export KILN_KERNEL_CACHE=/tmp/kiln-kernels KILN_DATA=$PWD/.gpu/data
export KILN_COMMIT=$(cat .gpucarry/COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
.gpu/bin/kiln info
log="$OUT/run.log"
if [ "$what" = all ] || [ "$what" = tests ]; then
  timeout 300 bash .gpu/run-tests.sh > "$OUT/tests.log" 2>&1; echo "tests exit $?"
  grep -E "^test result|FAILED|panicked|^test executables" "$OUT/tests.log" | tail -30
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
  timeout 200 .gpu/bin/kiln bench run --device cuda --out "$OUT/kiln_bench.json" >> "$log" 2>&1; echo "kiln bench exit $?"
  timeout 200 python3 bench/torch_bench.py --device cuda --out "$OUT/torch_bench.json" >> "$log" 2>&1; echo "torch bench exit $?"
  .gpu/bin/kiln bench compare "$OUT/kiln_bench.json" "$OUT/torch_bench.json" > "$OUT/compare.txt"
fi
if [ "$what" = dev ]; then
  # Development check: the train suite's epoch and per-step host times only.
  timeout 200 .gpu/bin/kiln bench run --device cuda --suite train --out "$OUT/kiln_bench_train.json" >> "$log" 2>&1
  echo "kiln bench train exit $?"; grep -E '"name"|"value"' "$OUT/kiln_bench_train.json" | paste - - | head -20
fi
if [ "$what" = all ] || [ "$what" = train ] || [ "$what" = dev ]; then
  run=/tmp/run-cuda
  timeout 200 .gpu/bin/kiln train --device cuda --data .gpu/data --out $run --quiet 2>&1 | tee -a "$log"
  cp $run/metrics.json "$OUT/kiln_train_cuda.json"; cp $run/curves.png "$OUT/curves_cuda.png"
  timeout 200 python3 bench/torch_train.py --data .gpu/data --device cuda --out "$OUT/torch_train_cuda.json" \
    --kiln-checkpoint $run/epoch-10.safetensors 2>&1 | tee -a "$log"
fi
