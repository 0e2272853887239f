#!/usr/bin/env bash
# Device-machine call for the GEMM plans' saved choices (issue 16, "same losses"): the GPU
# test suite with CUDA required (`tests`), then `kiln train` in separate processes (`repeat`):
#   A  --graph on,  empty kernel cache (compiles and times every GEMM plan, saves the choices)
#   B  --graph on,  same cache (reads A's choices)        C  --graph off, same cache
#   D  --graph on,  KILN_SAVED_CHOICES=off (times afresh, as before the saved choices)
#   E, F  --model cnn --epochs 2, same cache: E measures the convolutions' choices (kiln's
#         kernels, cuDNN's legacy algorithms and graph engines) and saves them, F reads them
# and compares their per-epoch losses and accuracies to the last bit, with the first epoch's
# time (cold cache in A, warm in B) and the median of the others.
#   (here) ../shared/tools/gpu-bundle --bins --data /usr/share/datasets/fashion-mnist
#          git rev-parse --short HEAD > .gpucarry/COMMIT
#          tar -cf - .gpu | xz -T2 --lzma2=preset=6,dict=384MiB > .gpucarry/gpu.tar.xz
#   (device tool) carry [".gpucarry"], command: bash bench/gpu_saved_choices.sh [tests,repeat]
set -uo pipefail
what=${1:-tests,repeat}
FINAL=${OUT:-/tmp/out}; OUT=/tmp/saved; mkdir -p "$OUT" "$FINAL"
trap 'rm -f "$OUT"/run_*/*.safetensors; tar -czf "$FINAL/results.tar.gz" -C "$OUT" .' EXIT
source bench/gpu_env.sh
[[ ",$what," == *",tests,"* ]] && run_tests 420
if [[ ",$what," == *",repeat,"* ]]; then
  epochs=${EPOCHS:-4}
  train() { # NAME GRAPH MODEL [ENV...]
    local name=$1 graph=$2 model=$3; shift 3
    env KILN_KERNEL_CACHE=/tmp/kc-saved KILN_GEMM_LOG=1 KILN_CUDNN_LOG=1 "$@" timeout 150 .gpu/bin/kiln train --device cuda \
      --data .gpu/data --model "$model" --epochs "$([ "$model" = cnn ] && echo 2 || echo "$epochs")" --graph "$graph" \
      --out "$OUT/run_$name" --quiet > "$OUT/run_$name.log" 2>&1
    local rc=$? log="$OUT/run_$name.log"
    echo "run $name ($model, --graph $graph $*): exit $rc; GEMM plans: $(grep -c 'kiln gemm.*timed:' "$log") timed," \
      "$(grep -c 'kiln gemm.*saved choice:' "$log") saved; cuDNN plans: $(grep -c 'kiln cuDNN.*chose' "$log") measured," \
      "$(grep -c 'kiln cuDNN.*saved choice' "$log") saved"
  }
  rm -rf /tmp/kc-saved
  train A on mlp; train B on mlp; train C off mlp; train D on mlp KILN_SAVED_CHOICES=off; train E on cnn; train F on cnn
  ls -l /tmp/kc-saved/*.txt 2>&1 | sed 's/^/  /'; cp /tmp/kc-saved/*.txt "$OUT/" 2>/dev/null
  python3 - "$OUT" <<'PY'
import json, statistics, sys
runs = {}
for name in "ABCDEF":
    try:
        m = json.load(open(f"{sys.argv[1]}/run_{name}/metrics.json"))
    except OSError as e:
        print(f"run {name}: no metrics ({e})"); continue
    runs[name] = m.get("epochs", m)
for name, ep in runs.items():
    secs = [e["seconds"] for e in ep]
    print(f"run {name}: epoch 1 {secs[0]*1e3:.0f} ms, median of the rest {statistics.median(secs[1:])*1e3:.2f} ms, "
          f"losses {[e['train_loss'] for e in ep]}, test acc {ep[-1]['test_acc']}")
key = lambda ep: [(e["train_loss"], e["train_acc"], e["test_acc"]) for e in ep]
for a, b in ["AB", "AC", "AD", "EF"]:
    if a in runs and b in runs:
        print(f"{a} vs {b}: {'identical to the last bit' if key(runs[a]) == key(runs[b]) else 'DIFFERENT'}")
PY
fi
