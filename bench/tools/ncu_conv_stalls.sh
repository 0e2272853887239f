#!/usr/bin/env bash
# Stall reasons, instruction counts and shared-memory bank conflicts of kiln's tensor-core
# convolution (conv_mma, forced) on the b256 32->64 14^2 5x5 forward, bf16 and TF32, under ncu
# (one device call, ~20 s). Carry [".kbin"] holding kiln.xz (see bench/gpu_conv_mma.sh).
#   (device tool) bash bench/tools/ncu_conv_stalls.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p /tmp/kb && for f in .kbin/kiln.xz; do b=$(basename "$f" .xz); xz -dc "$f" > /tmp/kb/$b; chmod +x /tmp/kb/$b; done
export KILN_KERNEL_CACHE=/tmp/kiln-kernels KILN_REQUIRE_CUDA=1
cudnn_lib=$(python3 -c 'import nvidia.cudnn as c, os; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=${cudnn_lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for p in bf16 tf32; do
KILN_CONV_MMA=1 KILN_BENCH_CONV=b256-32x64-14-k5 KILN_BENCH_CONV_PRECISIONS=$p timeout 200 "$ncu_bin" \
  --kernel-name regex:conv_mma6 --launch-skip 3 --launch-count 1 --section WarpStateStats --section SourceCounters \
  --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_tensor.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,sm__cycles_elapsed.avg \
  --print-details all /tmp/kb/kiln bench run --device cuda --suite conv --out /tmp/ncu.json > "$OUT/ncu_stalls_$p.txt" 2>&1
echo "ncu $p exit $?"
grep -E "stalled_.*ratio" "$OUT/ncu_stalls_$p.txt" | awk '$NF+0 > 0.15' | sed 's/smsp__average_warps_issue_stalled_//'
grep -E "inst_executed|hmma|wavefronts|bank_conflicts|cycles_elapsed" "$OUT/ncu_stalls_$p.txt"
done
