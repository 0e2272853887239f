#!/bin/bash
# Setup: mkdir -p .gpucarry2/probe && cp crates/kiln/src/backend/cuda/kernels/conv_mma.cu .gpucarry2/probe/ &&
#   patch .gpucarry2/probe/conv_mma.cu bench/results/2026-11-28i-h200-conv-phases/probe.patch; then run this
#   on the device machine with carry [".gpucarry2"].
# Probes of the wg conv kernel's phases: each a harness build with parts compiled out.
set -u
K=crates/kiln/src/backend/cuda/kernels
for v in "base:" "noA:-DPROBE_NO_A" "noMMA:-DPROBE_NO_MMA" "noStage:-DPROBE_NO_STAGE" "noStore:-DPROBE_NO_STORE" "noA_noStore:-DPROBE_NO_A -DPROBE_NO_STORE" "noMMA_noA:-DPROBE_NO_MMA -DPROBE_NO_A" "onlyMMA:-DPROBE_NO_A -DPROBE_NO_STAGE -DPROBE_NO_STORE"; do
  name=${v%%:*}; flags=${v#*:}
  nvcc -arch=sm_90a -O3 -std=c++17 $flags -I .gpucarry2/probe -I $K bench/tools/conv_wgmma/harness.cu -o /tmp/h_$name 2>&1 | grep -v warning | head -3 &
done
wait
for v in base noA noMMA noStage noStore noA_noStore noMMA_noA onlyMMA; do
  echo "== $v"; /tmp/h_$v 12 1 tf32 0 2>&1 | grep -E "wg back|from idle|b256" | sed 's/checked.*| wg flat/| wg flat/'
done
for v in base noA onlyMMA; do echo "== bf16 $v"; /tmp/h_$v 12 1 bf16 0 2>&1 | grep -E "b256" | sed 's/checked.*| wg flat/| wg flat/'; done
