#!/usr/bin/env bash
# Where one recorded training step of an MLP spends its GPU time, kiln beside PyTorch's
# CUDA-graph twin: the train suite of both (one model, HIDDEN, default 1024; full length,
# epoch times), then both again in quick mode under ncu with graph nodes profiled one by one
# (`--graph-profiling node`); the last recorded step's kernels of each are printed.
#   (here) cargo build --workspace --release --bins; xz -T2 -3 -c target/release/kiln > .kbin/kiln.xz
#   (device tool) carry [".kbin"], command: bash bench/tools/train_profile.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
mkdir -p .gpu/bin && xz -dc .kbin/kiln.xz > .gpu/bin/kiln && chmod +x .gpu/bin/kiln
export KILN_KERNEL_CACHE=/tmp/kiln-kernels KILN_BENCH_TRAIN_HIDDEN=${HIDDEN:-1024}
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for i in 1 2; do
  .gpu/bin/kiln bench run --device cuda --suite train --out "$OUT/kiln_train$i.json" 2>/dev/null | grep -E "^train/"
  python3 bench/torch_bench.py --device cuda --suite train --out "$OUT/torch_train$i.json" > /dev/null 2>&1
  python3 -c "import json,sys; [print('torch', r['name'], round(r['value'], 3), r['unit']) for r in json.load(open(sys.argv[1]))['results'] if r['name'].startswith('train/')]" "$OUT/torch_train$i.json"
done
ncu_csv() { timeout 240 "$ncu_bin" --graph-profiling node --clock-control none --metrics gpu__time_duration.sum --csv "$@" 2>/dev/null | grep -E '^"[0-9]'; }
ncu_csv .gpu/bin/kiln bench run --device cuda --suite train --quick > "$OUT/ncu_kiln.csv"; echo "ncu kiln exit $?"
ncu_csv python3 bench/torch_bench.py --device cuda --suite train --quick > "$OUT/ncu_torch.csv"; echo "ncu torch exit $?"
for who in kiln torch; do
  echo "== $who: the last ${LAST:-24} kernels"
  python3 - "$OUT/ncu_$who.csv" "${LAST:-24}" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
# No header after the grep: columns as ncu writes them.
kernels = []
for r in rows:
    name, unit, value = r[4], r[-2], float(r[-1].replace(',', ''))
    us = value * {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit, 1.0)
    kernels.append((us, r[8] if len(r) > 8 else "", name))
last = kernels[-int(sys.argv[2]):]
for us, grid, name in last:
    print(f"{us:8.2f} us {grid:>16}  {name[:110]}")
print(f"sum {sum(k[0] for k in last):.1f} us over {len(last)} kernels ({len(kernels)} in the log)")
PY
done
