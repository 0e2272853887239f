#!/usr/bin/env bash
# Device-machine call for deterministic convolutions (`KILN_CUDNN_DETERMINISTIC=1`,
# `kiln::cuda::set_conv_deterministic`): the GPU test suite with CUDA required (`tests`), the
# conv suite with cuDNN's full search and with its nondeterministic algorithms left out,
# beside PyTorch's conv suite in the same call (`bench`), and `kiln train --model cnn` with
# the setting, as a graph and eagerly, in separate processes (`cnn`).
#   (here) ../shared/tools/gpu-bundle --bins --data /usr/share/datasets/fashion-mnist
#          git rev-parse --short HEAD > .gpucarry/COMMIT
#          tar -cf - .gpu | xz -T2 --lzma2=preset=6,dict=384MiB > .gpucarry/gpu.tar.xz
#   (device tool) carry [".gpucarry"], command: bash bench/gpu_conv_deterministic.sh [tests,bench,cnn]
set -uo pipefail
what=${1:-tests,bench,cnn}
FINAL=${OUT:-/tmp/out}; OUT=/tmp/det; mkdir -p "$OUT" "$FINAL"
trap 'rm -f "$OUT"/cnn_*/*.safetensors "$OUT"/cnn_*/*.png; tar -czf "$FINAL/results.tar.gz" -C "$OUT" .' EXIT
source bench/gpu_env.sh
has() { [[ ",$what," == *",$1,"* ]]; }
has tests && run_tests 420
if has cnn; then
  for mode in on off; do
    KILN_CUDNN_DETERMINISTIC=1 KILN_KERNEL_CACHE=/tmp/kc-det timeout 150 .gpu/bin/kiln train --device cuda \
      --data .gpu/data --model cnn --epochs 2 --graph $mode --out "$OUT/cnn_$mode" --quiet > "$OUT/cnn_$mode.log" 2>&1
    echo "kiln train --model cnn --graph $mode (deterministic): exit $?"
  done
  python3 - "$OUT" <<'PY'
import json, sys
d = sys.argv[1]
runs = {m: json.load(open(f"{d}/cnn_{m}/metrics.json")) for m in ["on", "off"]}
runs = {m: r.get("epochs", r) for m, r in runs.items()}
for m, ep in runs.items():
    print(f"--graph {m}: seconds {[round(e['seconds'], 3) for e in ep]}, losses {[e['train_loss'] for e in ep]}, test acc {ep[-1]['test_acc']}")
key = lambda ep: [(e["train_loss"], e["train_acc"], e["test_acc"]) for e in ep]
print("graph vs eager:", "identical to the last bit" if key(runs["on"]) == key(runs["off"]) else "DIFFERENT")
PY
fi
if has bench; then
  for det in 0 1; do
    KILN_CUDNN_DETERMINISTIC=$det KILN_CUDNN_LOG=1 timeout 200 .gpu/bin/kiln bench run --device cuda --suite conv \
      --out "$OUT/kiln_conv_det$det.json" > /dev/null 2> "$OUT/choices_det$det.txt"
    echo "kiln conv suite, KILN_CUDNN_DETERMINISTIC=$det: exit $?"
  done
  timeout 200 python3 bench/torch_bench.py --device cuda --suite conv --out "$OUT/torch_conv.json" > "$OUT/torch.log" 2>&1
  echo "torch conv suite: exit $?"
  python3 - "$OUT" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda p: {r["name"]: r.get("median_ms") for r in json.load(open(p))["results"]}
full, det, torch = load(f"{d}/kiln_conv_det0.json"), load(f"{d}/kiln_conv_det1.json"), load(f"{d}/torch_conv.json")
print(f"{'row':44}{'full ms':>10}{'determ. ms':>12}{'torch ms':>10}{'full x':>8}{'det x':>8}")
worst = []
for n in sorted(full):
    f, g, t = full.get(n), det.get(n), torch.get(n)
    if not (f and g and t): continue
    worst.append((t / g, n))
    print(f"{n:44}{f:10.4f}{g:12.4f}{t:10.4f}{t / f:8.2f}{t / g:8.2f}")
worst.sort()
print("deterministic rows below 1.0x PyTorch:", [f"{n} {r:.2f}" for r, n in worst if r < 1.0] or "none")
PY
fi
