#!/usr/bin/env bash
# One device-machine call (issue 11): the gather floor under a CSR SpMV
# (bench/tools/gather_floor), the `sparse` suite of kiln and PyTorch in the same call, and the
# sparse tests with CUDA required.
#   (here) cargo test --release -p kiln --test sparse --no-run; cargo build --release -p kiln-cli --bins
#          mkdir -p .kbin; cp <sparse test executable> .kbin/sparse-test; cp target/release/kiln .kbin/
#          xz -T2 -3 .kbin/sparse-test .kbin/kiln
#   (device tool) carry [".kbin"], command: bash bench/gpu_sparse_floor.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for f in .kbin/*.xz; do xz -dk "$f"; done; chmod +x .kbin/sparse-test .kbin/kiln
export KILN_KERNEL_CACHE=/tmp/kiln-kernels
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
nvcc -O3 -arch=sm_90 -o /tmp/gather_floor bench/tools/gather_floor/gather_floor.cu 2>&1 | head
/tmp/gather_floor | tee "$OUT/gather_floor.txt"
KILN_SPARSE_LOG=1 timeout 240 .kbin/kiln bench run --device cuda --suite sparse --out "$OUT/kiln_sparse.json" > "$OUT/kiln_bench.log" 2>&1
echo "kiln bench exit $?"; grep "kiln sparse:" "$OUT/kiln_bench.log"
timeout 240 python3 bench/torch_bench.py --device cuda --suite sparse --out "$OUT/torch_sparse.json" > "$OUT/torch_bench.log" 2>&1
echo "torch bench exit $?"
.kbin/kiln bench compare "$OUT/kiln_sparse.json" "$OUT/torch_sparse.json" | grep -E "sparse/" | tee "$OUT/compare.txt"
/tmp/gather_floor | tee "$OUT/gather_floor_2.txt"
KILN_REQUIRE_CUDA=1 timeout 300 .kbin/sparse-test > "$OUT/sparse_test.log" 2>&1
echo "sparse-test exit $?"; grep -E "test result|FAILED|panicked" "$OUT/sparse_test.log" | head
