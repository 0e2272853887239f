#!/usr/bin/env bash
# ncu of one forced launch of the warpgroup convolution kernel (WG_KERNEL, default conv_wg4) on
# the b256 32→64 14² 5×5 forward, bf16 and TF32: stall reasons, instructions, tensor pipe.
#   (device tool) carry [".kbin"] (see bench/gpu_conv_wgmma.sh), command: bash bench/tools/ncu_conv_wg.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
mkdir -p /tmp/kb && for f in .kbin/*.xz; do b=$(basename "$f" .xz); xz -dc "$f" > /tmp/kb/$b; chmod +x /tmp/kb/$b; done
export KILN_KERNEL_CACHE=/tmp/kiln-kernels KILN_SAVED_CHOICES=off
cudnn_lib=$(python3 -c 'import nvidia.cudnn as c, os; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=${cudnn_lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for p in bf16 tf32; do
  case $p in bf16) k=${WG_KERNEL:-conv_wg4}_bf16;; tf32) k=${WG_KERNEL:-conv_wg4}_f32;; esac
  KILN_CONV_MMA=1 KILN_CONV_WGMMA=1 KILN_BENCH_CONV=b256-32x64-14-k5 KILN_BENCH_CONV_PRECISIONS=$p timeout 200 "$ncu_bin" \
    --kernel-name regex:"^${k}\$" --launch-skip 3 --launch-count 1 --print-details all --section WarpStateStats --section SpeedOfLight --section Occupancy --metrics \
    regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,smsp__inst_executed.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,sm__cycles_elapsed.avg,gpu__time_duration.sum,smsp__cycles_active.avg \
    /tmp/kb/kiln bench run --device cuda --suite conv --out /tmp/ncu.json > "$OUT/ncu_wg_$p.txt" 2>&1
  echo "ncu $p exit $?"
  grep -E "stalled_.*ratio" "$OUT/ncu_wg_$p.txt" | awk '$NF+0 > 0.1' | sed 's/smsp__average_warps_issue_stalled_//'
  grep -E "gmma|inst_executed.sum|wavefronts|bank_conflicts|cycles_elapsed|time_duration|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Block Limit|Dynamic Shared" "$OUT/ncu_wg_$p.txt"
done
