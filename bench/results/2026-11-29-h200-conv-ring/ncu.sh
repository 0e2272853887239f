#!/bin/bash
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
K=crates/kiln/src/backend/cuda/kernels
nvcc -arch=sm_90a -O3 -std=c++17 -lineinfo -DWG_ROTATE=0 -I $K bench/tools/conv_wgmma/harness.cu -o /tmp/rot0 2>/dev/null &
nvcc -arch=sm_90a -O3 -std=c++17 -lineinfo -DWS_ROTATE=0 -I scratch_ring -I $K scratch_ring/harness_ring.cu -o /tmp/ring 2>/dev/null &
wait
S="--section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SpeedOfLight --section SourceCounters"
timeout 200 ncu $S -k regex:conv_wg64_f32 --launch-skip 10 --launch-count 1 /tmp/rot0 12 1 tf32 0 > $OUT/ncu_wg64.txt 2>&1
WS_TPS=1 timeout 200 ncu $S -k regex:conv_wgs64_f32 --launch-skip 10 --launch-count 1 /tmp/ring 12 1 tf32 0 ws > $OUT/ncu_ring1.txt 2>&1
WS_TPS=3 timeout 200 ncu $S -k regex:conv_wgs64_f32 --launch-skip 10 --launch-count 1 /tmp/ring 12 1 tf32 0 ws > $OUT/ncu_ring3.txt 2>&1
for f in $OUT/ncu_*.txt; do echo "== $f"; grep -E "Duration|Stall|Issue Slot|Warp Cycles Per Issued|No Eligible|Active Warps|L2 Hit|Mem Busy|Max Bandwidth" $f | head -30; done
