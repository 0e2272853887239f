#!/usr/bin/env bash
# One device-machine call for the launch-free training work (issue: CUDA graphs): every test
# with CUDA required, the kiln and PyTorch benchmark suites, the train suite again with the
# activation epilogue off (A/B), `kiln train` with graphs and eagerly beside PyTorch, and the
# first epoch with an empty and a warm kernel cache. At most 8 files come back in $OUT.
#   (here) ../shared/tools/gpu-bundle --bins --data /usr/share/datasets/fashion-mnist
#          git rev-parse --short HEAD > .gpucarry/COMMIT; tar -cf - .gpu | xz -T2 > .gpucarry/gpu.tar.xz
#   (device tool) carry [".gpucarry"], command: bash bench/gpu_graphs.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; log=/tmp/gpu_graphs.log
[ -d .gpu ] || xz -dc .gpucarry/gpu.tar.xz | tar -xf -
export KILN_KERNEL_CACHE=/tmp/kiln-kernels KILN_DATA=$PWD/.gpu/data
export KILN_COMMIT=$(cat .gpucarry/COMMIT 2>/dev/null || echo unknown)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 300 bash .gpu/run-tests.sh > "$OUT/tests.log" 2>&1; echo "tests exit $?"
grep -E "FAILED|panicked|^test executables" "$OUT/tests.log" | tail -12
timeout 240 .gpu/bin/kiln bench run --device cuda --out "$OUT/kiln_bench.json" >> $log 2>&1; echo "kiln bench exit $?"
timeout 240 python3 bench/torch_bench.py --device cuda --out "$OUT/torch_bench.json" >> $log 2>&1; echo "torch bench exit $?"
KILN_GEMM_EPILOGUE_ACT=0 timeout 120 .gpu/bin/kiln bench run --device cuda --suite train --out /tmp/kiln_bench_noact.json >> $log 2>&1
.gpu/bin/kiln bench compare "$OUT/kiln_bench.json" "$OUT/torch_bench.json" > /tmp/compare.txt
grep -E "train/|overhead/" /tmp/compare.txt
run=/tmp/run-cuda
timeout 200 .gpu/bin/kiln train --device cuda --data .gpu/data --out $run --quiet 2>&1 | tee -a $log | tail -3
cp $run/metrics.json "$OUT/kiln_train_cuda.json"; cp $run/curves.png "$OUT/curves_cuda.png"
timeout 200 .gpu/bin/kiln train --device cuda --data .gpu/data --graph off --out /tmp/run-eager --quiet >> $log 2>&1
cp /tmp/run-eager/metrics.json "$OUT/kiln_train_cuda_eager.json"
timeout 200 python3 bench/torch_train.py --data .gpu/data --device cuda --out "$OUT/torch_train_cuda.json" \
  --kiln-checkpoint $run/epoch-10.safetensors 2>&1 | tail -2
for cache in cold warm; do
  [ $cache = cold ] && rm -rf /tmp/kiln-cold-cache
  s=$(date +%s%N)
  KILN_KERNEL_CACHE=/tmp/kiln-cold-cache timeout 200 .gpu/bin/kiln train --device cuda --data .gpu/data \
    --epochs 2 --quiet --out /tmp/run-$cache > /dev/null 2>&1
  echo $(( ($(date +%s%N) - s) / 1000000 )) > /tmp/whole-$cache
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
first = lambda c: json.load(open(f"/tmp/run-{c}/metrics.json"))["epochs"][0]["seconds"] * 1e3
noact = {r["name"]: r["value"] for r in json.load(open("/tmp/kiln_bench_noact.json"))["results"]}
extra = {"cold_first_epoch_ms": first("cold"), "warm_first_epoch_ms": first("warm"),
         "cold_whole_run_ms": int(open("/tmp/whole-cold").read()), "warm_whole_run_ms": int(open("/tmp/whole-warm").read()),
         "train_suite_activation_epilogue_off": noact}
json.dump(extra, open(f"{out}/extra.json", "w"), indent=1)
print(json.dumps({k: v for k, v in extra.items() if k != "train_suite_activation_epilogue_off"}))
print({k: round(v, 2) for k, v in noact.items() if "epoch" in k or "launch" in k or "kernels" in k})
PY
