#!/usr/bin/env bash
# One device-machine call: unpack the bundle, run every test with CUDA required, the kiln and
# PyTorch benchmarks with their comparison, and `kiln train` beside PyTorch eager training.
#   (here) ../shared/tools/gpu-bundle --bins --data /usr/share/datasets/fashion-mnist
#          git rev-parse --short HEAD > .gpucarry/COMMIT; tar -cf - .gpu | xz -T2 > .gpucarry/gpu.tar.xz
#   (device tool) carry [".gpucarry"], command: bash bench/gpu_run.sh [tests|bench|train|dev|cold|all]
#   dev: the train and overhead benchmark suites (kiln and PyTorch) and `kiln train` only
#   cold: `kiln train` first-epoch times with an empty and a warm kernel cache
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
  # Development check: the train and overhead suites, kiln beside PyTorch.
  timeout 200 .gpu/bin/kiln bench run --device cuda --suite train,overhead --out "$OUT/kiln_bench.json" >> "$log" 2>&1
  echo "kiln bench exit $?"
  timeout 200 python3 bench/torch_bench.py --device cuda --suite train,overhead --out "$OUT/torch_bench.json" >> "$log" 2>&1
  echo "torch bench exit $?"
  .gpu/bin/kiln bench compare "$OUT/kiln_bench.json" "$OUT/torch_bench.json" > "$OUT/compare.txt"
  grep -E "train|overhead" "$OUT/compare.txt" | head -40
fi
if [ "$what" = all ] || [ "$what" = cold ] || [ "$what" = dev ]; then
  # First epoch with an empty kernel cache (a new user), then with the cache it filled.
  for cache in cold warm; do
    [ $cache = cold ] && rm -rf /tmp/kiln-cold-cache
    s=$(date +%s%N)
    KILN_KERNEL_CACHE=/tmp/kiln-cold-cache timeout 200 .gpu/bin/kiln train --device cuda --data .gpu/data \
      --epochs 2 --quiet 2>&1 | tee -a "$log" | sed "s/^/$cache: /"
    echo "$cache: whole run $(( ($(date +%s%N) - s) / 1000000 )) ms"
  done
  ls /tmp/kiln-cold-cache | sed 's/-[0-9a-f]*-sm.*//' | tr '\n' ' '; echo
  du -sh /tmp/kiln-cold-cache
fi
if [ "$what" = all ] || [ "$what" = train ] || [ "$what" = dev ]; then
  run=/tmp/run-cuda
  timeout 200 .gpu/bin/kiln train --device cuda --data .gpu/data --out $run --quiet 2>&1 | tee -a "$log"
  timeout 200 .gpu/bin/kiln train --device cuda --data .gpu/data --graph off --quiet 2>&1 | sed 's/^/eager: /' | tee -a "$log"
  cp $run/metrics.json "$OUT/kiln_train_cuda.json"; cp $run/curves.png "$OUT/curves_cuda.png"
  timeout 200 python3 bench/torch_train.py --data .gpu/data --device cuda --out "$OUT/torch_train_cuda.json" \
    --kiln-checkpoint $run/epoch-10.safetensors 2>&1 | tee -a "$log"
fi
