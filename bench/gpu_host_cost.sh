#!/usr/bin/env bash
# One device-machine call for the eager host cost (issue: launch-free training, item 7): the
# whole GPU test suite with CUDA required, then the driver's own launch floor
# (bench/tools/launch_floor.cu), and kiln's and PyTorch's overhead and train suites in the
# same call.
#   (here) ../shared/tools/gpu-bundle --bins --data /usr/share/datasets/fashion-mnist
#          git rev-parse --short HEAD > .gpucarry/COMMIT; tar -cf - .gpu | xz -T2 -3 > .gpucarry/gpu.tar.xz
#   (device tool) carry [".gpucarry"], command: bash bench/gpu_host_cost.sh [tests,bench,gemm]
set -uo pipefail
what=${1:-tests,bench}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source bench/gpu_env.sh
[[ ",$what," == *",tests,"* ]] && run_tests 330
if [[ ",$what," == *",bench,"* ]]; then
  nvcc -O2 -arch=sm_90 -o /tmp/launch_floor bench/tools/launch_floor.cu -lcuda && /tmp/launch_floor | tee "$OUT/launch_floor.txt"
  timeout 150 .gpu/bin/kiln bench run --device cuda --suite overhead,train --out "$OUT/kiln_bench.json" > /tmp/kb.log 2>&1; echo "kiln bench exit $?"
  timeout 200 python3 bench/torch_bench.py --device cuda --suite overhead,train --out "$OUT/torch_bench.json" > /tmp/tb.log 2>&1; echo "torch bench exit $?"
  .gpu/bin/kiln bench compare "$OUT/kiln_bench.json" "$OUT/torch_bench.json" | grep -E "overhead/|train/"
fi
# A/B of kiln's small GEMM kernel (cuBLASLt alone against the measured choice) on the train
# suite, and the plans' choices.
if [[ ",$what," == *",gemm,"* ]]; then
  KILN_GEMM_ENGINE=library timeout 120 .gpu/bin/kiln bench run --device cuda --suite train --out "$OUT/kiln_train_library.json" > /tmp/lib.log 2>&1; echo "library-only exit $?"
  .gpu/bin/kiln bench compare "$OUT/kiln_train_library.json" "$OUT/kiln_bench.json" | grep -E "epoch|step/"
  KILN_GEMM_LOG=1 timeout 120 .gpu/bin/kiln bench run --device cuda --suite train --quick --out /tmp/log.json 2>&1 | grep "kiln gemm" | sort | uniq -c | tee "$OUT/gemm_choices.txt"
fi
