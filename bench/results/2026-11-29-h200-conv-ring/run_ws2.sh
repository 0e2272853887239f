#!/bin/bash
# Second round: the ring without the stagger (WS_STAGGER=0) and with larger groups (WS_TPS).
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
K=crates/kiln/src/backend/cuda/kernels
nvcc -arch=sm_90a -O3 -std=c++17 -DWS_STAGGER=0 -I $K bench/tools/conv_wgmma/harness.cu -o /tmp/ns4 2>/dev/null &
nvcc -arch=sm_90a -O3 -std=c++17 -DWS_STAGGER=0 -DWS_LEAD=8 -I $K bench/tools/conv_wgmma/harness.cu -o /tmp/ns8 2>/dev/null &
nvcc -arch=sm_90a -O3 -std=c++17 -DWS_STAGGER=1 -I $K bench/tools/conv_wgmma/harness.cu -o /tmp/st4 2>/dev/null &
wait
for r in 1 2; do
  for v in "ns4 1" "ns8 1" "ns4 2" "st4 2" "ns4 3" "st4 3"; do set -- $v
    echo "== $1 tps $2 round $r"; WS_TPS=$2 timeout 60 /tmp/$1 12 1 tf32 -1 ws 2>&1 | tail -3
  done
done 2>&1 | tee $OUT/ws2.log
echo "== bf16 ns4"; timeout 60 /tmp/ns4 12 1 bf16 -1 ws 2>&1 | tail -3
timeout 200 compute-sanitizer --tool synccheck /tmp/st4 12 4 tf32 3 ws 2>&1 | head -40 | tee $OUT/synccheck.log
