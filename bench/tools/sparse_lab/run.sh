#!/usr/bin/env bash
# Build and run the sparse-product lab on the GPU machine (nvcc and cuSPARSE there), then
# PyTorch's sparse suite in the same call, then ncu on chosen kernels (NCU="regex ..." names
# them; empty skips). Usage (device tool): bash bench/tools/sparse_lab/run.sh [MATRICES]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
nvcc -O3 -std=c++17 -arch=sm_90 -lineinfo -o /tmp/sparse_lab sparse_lab.cu -lcusparse 2>&1 | grep -v "Wno-deprecated" | head -20
/tmp/sparse_lab "${1:-cycle,random16,powerlaw}" 2>&1 | tee "$OUT/lab.txt"
cd - > /dev/null
if [ "${TORCH:-1}" = 1 ]; then
  timeout 240 python3 "$(dirname "$0")/../../torch_bench.py" --device cuda --suite sparse --out "$OUT/torch_sparse.json" > /dev/null 2>&1
  python3 -c "import json,sys; [print(f\"torch {r['name']:28} {r['median_ms']*1e3:9.1f} us\") for r in json.load(open('$OUT/torch_sparse.json'))['results'] if r['name'].startswith('sparse')]"
fi
# NCU="spmv_kiln:115 spmm_panel:3": kernel-name regex and launches to skip (each variant runs
# 28 times: 3 warm-up, 25 timed).
for ks in ${NCU:-}; do
  k=${ks%%:*}; skip=${ks##*:}
  timeout 200 ncu --kernel-name "regex:^$k" --launch-skip "$skip" --launch-count 1 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats /tmp/sparse_lab "${NCU_MATRIX:-random16}" \
    > "$OUT/ncu_$k-$skip.txt" 2>&1
  grep -E "^  [a-z_0-9<>]+\(|Throughput|Hit Rate|Achieved Occupancy|Duration|Stall|Warp Cycles Per Issued" "$OUT/ncu_$k-$skip.txt" | head -30
done
