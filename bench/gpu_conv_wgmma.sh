#!/usr/bin/env bash
# One device-machine call for the warpgroup (wgmma) convolution kernel (kernels/conv_wgmma.cu):
# the forced tensor-core test (both kernels), the conv op tests, then the conv suite's
# small-channel rows with the warpgroup kernel excluded (KILN_CONV_WGMMA=0), allowed (the
# default measured choice) and forced (=1), alternated twice, beside PyTorch's conv suite.
#   (here) CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols cargo build --release -p kiln-cli --bins;
#          the same env: cargo test --release -p kiln --test conv_mma --test ops_conv --no-run;
#          copy target/release/kiln and the two test executables (conv_mma-test, ops_conv-test)
#          into .kbin/ and xz them
#   (device tool) carry [".kbin"], command: bash bench/gpu_conv_wgmma.sh [tests,ab,full,cnn]
#   "full": the whole conv suite (default choices) beside PyTorch's; "cnn": the cnn suite.
set -uo pipefail
what=${1:-tests,ab}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
mkdir -p /tmp/kb && for f in .kbin/*.xz; do b=$(basename "$f" .xz); xz -dc "$f" > /tmp/kb/$b; chmod +x /tmp/kb/$b; done
export KILN_KERNEL_CACHE=/tmp/kiln-kernels KILN_REQUIRE_CUDA=1 KILN_SAVED_CHOICES=off
cudnn_lib=$(python3 -c 'import nvidia.cudnn as c, os; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=${cudnn_lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
has() { [[ ",$what," == *",$1,"* ]]; }
if has tests; then
  timeout 240 /tmp/kb/conv_mma-test > "$OUT/conv_mma_test.log" 2>&1; echo "conv_mma-test exit $? $(grep -E '^test result' "$OUT/conv_mma_test.log")"
  grep -E -A6 "panicked" "$OUT/conv_mma_test.log" | cut -c1-400 | head -14
  for mode in KILN_CONV_WGMMA=auto "KILN_CONV_MMA=1 KILN_CONV_WGMMA=1"; do
    env $mode timeout 200 /tmp/kb/ops_conv-test > /tmp/ops_conv.log 2>&1
    echo "$mode: ops_conv exit $? $(grep -E '^test result' /tmp/ops_conv.log)"
    grep -E -A6 "panicked" /tmp/ops_conv.log | cut -c1-400 | head -14
  done
fi
table() {  # $1: folder with kiln_*.json and torch_conv.json
  python3 - "$1" <<'PY'
import json, sys, glob
d = sys.argv[1]
load = lambda p: {r["name"]: r for r in json.load(open(p))["results"]}
runs = {p.split("/")[-1][:-5]: load(p) for p in sorted(glob.glob(f"{d}/kiln*.json"))}
torch = load(f"{d}/torch_conv.json")
names = sorted(set().union(*[set(r) for r in runs.values()]))
cols = sorted(runs)
print(f"{'row (ms)':36}" + "".join(f"{c[5:]:>11}" for c in cols) + f"{'torch':>9}" + "   torch/kiln per column")
for n in names:
    t = torch.get(n, {}).get("median_ms")
    vals = [runs[c].get(n, {}).get("median_ms") for c in cols]
    print(f"{n:36}" + "".join(f"{v:11.4f}" if v else f"{'':>11}" for v in vals) + (f"{t:9.4f}" if t else f"{'':>9}")
          + ("   " + " ".join(f"{t / v:.2f}" if v else "-" for v in vals) if t else ""))
PY
}
if has ab; then
  export KILN_BENCH_CONV=${KILN_BENCH_CONV:-b32-32x64-28-k3,b1-3x64-224-k3,b256-1x32-28-k5,b256-32x64-14-k5}
  export KILN_BENCH_CONV_PRECISIONS=${KILN_BENCH_CONV_PRECISIONS:-tf32,bf16}
  mkdir -p /tmp/ab
  for round in 1 2; do
    for wg in 0 auto 1; do
      KILN_CONV_WGMMA=$wg KILN_CUDNN_LOG=1 timeout 150 /tmp/kb/kiln bench run --device cuda --suite conv \
        --out /tmp/ab/kiln_wg${wg}_r$round.json > /dev/null 2> /tmp/ab/choices_wg${wg}_r$round.txt
      echo "KILN_CONV_WGMMA=$wg round $round exit $?"
    done
  done
  timeout 200 python3 bench/torch_bench.py --device cuda --suite conv --out /tmp/ab/torch_conv.json > /dev/null 2>&1
  echo "torch bench exit $?"
  table /tmp/ab
  grep -hE "kiln conv2d" /tmp/ab/choices_wgauto_r1.txt | cut -c1-300 | head -24
  tar -C /tmp -czf "$OUT/ab.tgz" ab
fi
if has full; then
  unset KILN_BENCH_CONV KILN_BENCH_CONV_PRECISIONS
  mkdir -p /tmp/full
  KILN_CUDNN_LOG=1 timeout 250 /tmp/kb/kiln bench run --device cuda --suite conv --out /tmp/full/kiln_conv.json \
    > /dev/null 2> /tmp/full/choices.txt; echo "kiln conv suite exit $?"
  timeout 250 python3 bench/torch_bench.py --device cuda --suite conv --out /tmp/full/torch_conv.json > /dev/null 2>&1
  echo "torch conv suite exit $?"
  table /tmp/full
  tar -C /tmp -czf "$OUT/full.tgz" full
fi
if has cnn; then
  timeout 200 /tmp/kb/kiln bench run --device cuda --suite cnn --out "$OUT/kiln_cnn.json" > /dev/null 2>&1; echo "kiln cnn exit $?"
  timeout 300 python3 bench/torch_bench.py --device cuda --suite cnn --out "$OUT/torch_cnn.json" > /dev/null 2>&1; echo "torch cnn exit $?"
  /tmp/kb/kiln bench compare "$OUT/kiln_cnn.json" "$OUT/torch_cnn.json" | grep -E "cnn/"
fi
