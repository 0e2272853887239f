#!/usr/bin/env bash
# One device-machine call for the launch-free training issue's closing figures: the driver's
# own launch floor (bench/tools/launch_floor.cu), kiln's and PyTorch's overhead and train
# suites in two alternated rounds, `kiln train` with defaults (graphs) and with --graph off
# (same seed: losses compared to the last bit), and the first epoch with an empty and with a
# warm kernel cache (saved choices off in both, so the empty-cache run compiles and measures
# everything).
#   (here) cargo build --release -p kiln-cli --bins; mkdir -p .kbin/data; xz -c target/release/kiln > .kbin/kiln.xz;
#          cp /usr/share/datasets/fashion-mnist/* .kbin/data/
#   (device tool) carry [".kbin"], command: bash bench/gpu_issue16_final.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
mkdir -p /tmp/kb && xz -dc .kbin/kiln.xz > /tmp/kb/kiln && chmod +x /tmp/kb/kiln
K=/tmp/kb/kiln; DATA=$PWD/.kbin/data
export KILN_KERNEL_CACHE=/tmp/kiln-kernels PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvcc -O2 -arch=sm_90 -o /tmp/launch_floor bench/tools/launch_floor.cu -lcuda && /tmp/launch_floor | tee "$OUT/launch_floor.txt"
# The empty-cache run first, while nothing is compiled yet.
for cache in cold warm; do
  s=$(date +%s%N)
  KILN_KERNEL_CACHE=/tmp/kiln-first KILN_SAVED_CHOICES=off timeout 200 $K train --device cuda --data $DATA \
    --epochs 2 --quiet --out /tmp/first-$cache > /tmp/first-$cache.log 2>&1
  echo "first-epoch run ($cache cache) exit $? whole run $(( ($(date +%s%N) - s) / 1000000 )) ms"
done
for round in 1 2; do
  timeout 150 $K bench run --device cuda --suite overhead,train --out "$OUT/kiln_r$round.json" > /tmp/kb_r$round.log 2>&1
  echo "kiln bench round $round exit $?"
  timeout 200 python3 bench/torch_bench.py --device cuda --suite overhead,train --out "$OUT/torch_r$round.json" > /tmp/tb_r$round.log 2>&1
  echo "torch bench round $round exit $?"
  $K bench compare "$OUT/kiln_r$round.json" "$OUT/torch_r$round.json" | grep -E "overhead/|train/"
done
for mode in auto off; do
  timeout 200 $K train --device cuda --data $DATA --graph $mode --quiet --out /tmp/train-$mode > /tmp/train-$mode.log 2>&1
  echo "kiln train --graph $mode exit $?"
  cp /tmp/train-$mode/metrics.json "$OUT/train_graph_$mode.json"
done
for c in cold warm; do cp /tmp/first-$c/metrics.json "$OUT/first_epoch_$c.json"; done
python3 - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
load = lambda n: json.load(open(f"{out}/{n}"))
ep = lambda m: m.get("epochs", m)
for mode in ("auto", "off"):
    e = ep(load(f"train_graph_{mode}.json"))
    secs = [x["seconds"] * 1e3 for x in e]
    print(f"kiln train --graph {mode}: epoch 1 {secs[0]:.1f} ms, median of epochs 2-10 {statistics.median(secs[1:]):.2f} ms, "
          f"test accuracy {e[-1]['test_acc']:.4f}")
a, o = ep(load("train_graph_auto.json")), ep(load("train_graph_off.json"))
keys = [k for k in a[0] if "loss" in k or "acc" in k]
same = all(x[k] == y[k] for x, y in zip(a, o) for k in keys)
print(f"graph and eager runs: {keys} equal to the last bit at every epoch: {same}")
for c in ("cold", "warm"):
    e = ep(load(f"first_epoch_{c}.json"))
    print(f"first epoch, {c} kernel cache: {e[0]['seconds'] * 1e3:.0f} ms")
PY
