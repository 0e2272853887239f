#!/usr/bin/env bash
# Device-machine calls for several training steps in one CUDA graph (issue 16): the GPU test
# suite with CUDA required, then the train suite with one step per graph and with the default
# group (alternated, two rounds each) beside PyTorch's train suite (eager and its CUDA-graph
# twin) in the same call, then `kiln train` with defaults (warm kernel cache) both ways.
#   (here) ../shared/tools/gpu-bundle --bins --data /usr/share/datasets/fashion-mnist
#          git rev-parse --short HEAD > .gpucarry/COMMIT
#          tar -cf - .gpu | xz -T2 --lzma2=preset=6,dict=384MiB > .gpucarry/gpu.tar.xz
#   (device tool) carry [".gpucarry"], command: bash bench/gpu_steps_per_graph.sh [tests,bench]
set -uo pipefail
what=${1:-tests,bench}
# Everything goes to a work folder, then back as one archive (the tool returns few files).
FINAL=${OUT:-/tmp/out}; OUT=/tmp/spg; mkdir -p "$OUT" "$FINAL"
trap 'rm -f "$OUT"/train_k*/*.safetensors; tar -czf "$FINAL/results.tar.gz" -C "$OUT" .' EXIT
source bench/gpu_env.sh
[[ ",$what," == *",tests,"* ]] && run_tests 420
if [[ ",$what," == *",bench,"* ]]; then
  for round in 1 2; do
    for k in 1 16; do
      KILN_BENCH_STEPS_PER_GRAPH=$k timeout 100 .gpu/bin/kiln bench run --device cuda --suite train \
        --out "$OUT/kiln_train_k${k}_r$round.json" > "$OUT/kiln_train_k${k}_r$round.log" 2>&1
      echo "kiln train suite, $k steps per graph, round $round: exit $?"
    done
    timeout 150 python3 bench/torch_bench.py --device cuda --suite train --out "$OUT/torch_train_r$round.json" \
      > "$OUT/torch_train_r$round.log" 2>&1; echo "torch train suite round $round: exit $?"
    for k in 1 16; do
      echo "== round $round, kiln with $k steps per graph"
      .gpu/bin/kiln bench compare "$OUT/kiln_train_k${k}_r$round.json" "$OUT/torch_train_r$round.json" | grep -E "train/"
    done
  done
  for k in 1 16; do
    timeout 60 .gpu/bin/kiln train --device cuda --data .gpu/data --steps-per-graph $k --out "$OUT/train_k$k" --quiet \
      > "$OUT/kiln_train_cli_k$k.log" 2>&1; echo "kiln train --steps-per-graph $k: exit $?"
    python3 - "$OUT/train_k$k/metrics.json" <<'PY'
import json, statistics, sys
m = json.load(open(sys.argv[1]))
ep = m.get("epochs", m)
secs = [e.get("seconds", e.get("epoch_seconds")) for e in ep]
accs = [e.get("test_acc") for e in ep]
print(f"  epoch 1 {secs[0]*1e3:.1f} ms, median of epochs 2-10 {statistics.median(secs[1:])*1e3:.2f} ms, test accuracy {accs[-1]:.4f}")
PY
  done
fi
