#!/usr/bin/env bash
# One device-machine call for kiln's tensor-core convolution (cuda/conv_mma.rs): its forced
# test, the conv op tests by default and with the kernel forced, then the conv suite of kiln
# (with cuDNN's and the kernel's measured choices logged) beside PyTorch.
#   (here) CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols cargo build --release -p kiln-cli --bins;
#          the same env: cargo test --release -p kiln --test conv_mma --test ops_conv --no-run;
#          copy target/release/kiln and the two test executables (as conv_mma-test, ops_conv-test)
#          into .kbin/ and xz them (xz -T2 -3 .kbin/*)
#          (train-test too, for the CNN tests with the kernel forced)
#   (device tool) carry [".kbin"], command: bash bench/gpu_conv_mma.sh [tests,bench,ab,cnn,ncu,stalls]
#   "ncu": sections of one forced launch (SHAPE, PRECISIONS); "stalls": its stall reasons,
#   instruction counts and shared-memory bank conflicts, the metrics only (ncu_stalls_<p>.txt).
#   "ab": a second kiln binary carried as .kbin/kiln-old.xz (the build before a kernel change)
#   and the new one, alternated twice on the small-channel conv rows (KILN_BENCH_CONV,
#   KILN_BENCH_CONV_PRECISIONS pick others), beside PyTorch's conv suite; reports in ab.tgz.
set -uo pipefail
what=${1:-tests,bench}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
mkdir -p /tmp/kb && for f in .kbin/*.xz; do b=$(basename "$f" .xz); xz -dc "$f" > /tmp/kb/$b; chmod +x /tmp/kb/$b; done
export KILN_KERNEL_CACHE=/tmp/kiln-kernels KILN_REQUIRE_CUDA=1
cudnn_lib=$(python3 -c 'import nvidia.cudnn as c, os; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=${cudnn_lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
has() { [[ ",$what," == *",$1,"* ]]; }
if has tests; then
  timeout 200 /tmp/kb/conv_mma-test > "$OUT/conv_mma_test.log" 2>&1; echo "conv_mma-test exit $? $(grep -E '^test result' "$OUT/conv_mma_test.log")"
  grep -E -A6 "panicked" "$OUT/conv_mma_test.log" | cut -c1-400 | head -14
  for mode in KILN_CONV_MMA=auto KILN_CONV_MMA=1 KILN_CONV_DIRECT=1; do
    [ -x /tmp/kb/ops_conv-test ] || continue
    env $mode timeout 200 /tmp/kb/ops_conv-test > /tmp/ops_conv.log 2>&1
    echo "$mode: ops_conv exit $? $(grep -E '^test result' /tmp/ops_conv.log)"
    grep -E -A6 "panicked" /tmp/ops_conv.log | cut -c1-400 | head -14
  done
  if [ -x /tmp/kb/train-test ]; then
    KILN_CONV_MMA=1 timeout 200 /tmp/kb/train-test cnn > /tmp/train.log 2>&1
    echo "KILN_CONV_MMA=1: train cnn exit $? $(grep -E '^test result' /tmp/train.log)"
  fi
fi
if has bench; then
  KILN_CUDNN_LOG=1 timeout 200 /tmp/kb/kiln bench run --device cuda --suite conv --out "$OUT/kiln_conv.json" \
    > /tmp/bench.out 2> "$OUT/choices.txt"
  echo "kiln bench exit $?"; grep -E "mma" "$OUT/choices.txt" | cut -c1-300 | head -40
  timeout 200 python3 bench/torch_bench.py --device cuda --suite conv --out "$OUT/torch_conv.json" > /tmp/torch.out 2>&1
  echo "torch bench exit $?"
  /tmp/kb/kiln bench compare "$OUT/kiln_conv.json" "$OUT/torch_conv.json" | grep -E "conv/"
fi
if has ab; then
  export KILN_BENCH_CONV=${KILN_BENCH_CONV:-b32-32x64-28-k3,b1-3x64-224-k3,b256-1x32-28-k5,b256-32x64-14-k5}
  export KILN_BENCH_CONV_PRECISIONS=${KILN_BENCH_CONV_PRECISIONS:-tf32,bf16}
  mkdir -p /tmp/ab
  for round in 1 2; do
    for bin in kiln-old kiln; do
      KILN_CUDNN_LOG=1 timeout 120 /tmp/kb/$bin bench run --device cuda --suite conv --out /tmp/ab/${bin}_$round.json \
        > /dev/null 2> /tmp/ab/${bin}_${round}_choices.txt
      echo "$bin round $round exit $?"
    done
  done
  timeout 200 python3 bench/torch_bench.py --device cuda --suite conv --out /tmp/ab/torch_conv.json > /dev/null 2>&1
  echo "torch bench exit $?"
  python3 - /tmp/ab <<'PY'
import json, sys, glob
d = sys.argv[1]
load = lambda p: {r["name"]: r for r in json.load(open(p))["results"]}
runs = {p.split("/")[-1][:-5]: load(p) for p in sorted(glob.glob(f"{d}/kiln*.json"))}
torch = load(f"{d}/torch_conv.json")
names = sorted(set().union(*[set(r) for r in runs.values()]))
cols = sorted(runs)
print(f"{'row':40}" + "".join(f"{c:>14}" for c in cols) + f"{'torch':>10}" + "   ratios new/torch")
for n in names:
    t = torch.get(n, {}).get("median_ms")
    vals = [runs[c].get(n, {}).get("median_ms") for c in cols]
    new = [v for c, v in zip(cols, vals) if c.startswith("kiln_") and v]
    print(f"{n:40}" + "".join(f"{v:14.4f}" if v else f"{'':>14}" for v in vals) + (f"{t:10.4f}" if t else f"{'':>10}")
          + ("   " + " ".join(f"{t / v:.2f}" for v in new) if t and new else ""))
PY
  grep -hE "mma|direct" /tmp/ab/kiln_1_choices.txt | cut -c1-260 | head -24
  tar -C /tmp -czf "$OUT/ab.tgz" ab
fi
if has cnn; then
  timeout 200 /tmp/kb/kiln bench run --device cuda --suite cnn --out "$OUT/kiln_cnn.json" > /dev/null 2>&1
  timeout 200 python3 bench/torch_bench.py --device cuda --suite cnn --out "$OUT/torch_cnn.json" > /dev/null 2>&1
  /tmp/kb/kiln bench compare "$OUT/kiln_cnn.json" "$OUT/torch_cnn.json" | grep -E "cnn/"
fi
if has ncu || has stalls; then
  # One forced launch of the kernel on one problem (SHAPE, PRECISIONS) under ncu.
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  profile() {  # profile PRECISION OUTFILE NCU-ARGS...
    local p=$1 out=$2; shift 2
    KILN_CONV_MMA=1 KILN_BENCH_CONV=${SHAPE:-b256-32x64-14-k5} KILN_BENCH_CONV_PRECISIONS=$p timeout 200 "$ncu_bin" \
      --kernel-name regex:conv_mma6 --launch-skip 3 --launch-count 1 "$@" \
      /tmp/kb/kiln bench run --device cuda --suite conv --out /tmp/ncu.json > "$out" 2>&1
    echo "ncu $p exit $?"
  }
  for p in ${PRECISIONS:-bf16 tf32}; do
    if has ncu; then
      profile $p "$OUT/ncu_$p.txt" --section SpeedOfLight --section WarpStateStats --section Occupancy \
        --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --metrics smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
      grep -E "Duration|Achieved Occupancy|Registers|Warp Cycles Per Issued|Issued Ipc|Compute \(SM\)" "$OUT/ncu_$p.txt" | head -12
    fi
    if has stalls; then
      profile $p "$OUT/ncu_stalls_$p.txt" --print-details all --metrics \
        regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_tensor.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,sm__cycles_elapsed.avg
      grep -E "stalled_.*ratio" "$OUT/ncu_stalls_$p.txt" | awk '$NF+0 > 0.15' | sed 's/smsp__average_warps_issue_stalled_//'
      grep -E "inst_executed|hmma|wavefronts|bank_conflicts|cycles_elapsed" "$OUT/ncu_stalls_$p.txt"
    fi
  done
fi
