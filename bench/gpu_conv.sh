#!/usr/bin/env bash
# One device-machine call for the convolutional-networks work: every test with CUDA required
# (or only FILTER's), the conv tests again with each cuDNN API alone and with kiln's direct kernels forced (apis), the `conv` and `cnn` suites of kiln and PyTorch (CUDA, then 2 CPU cores),
# `kiln train --model cnn` with graphs and eagerly beside PyTorch, and the kiln checkpoint
# scored in PyTorch. At most 8 files come back in $OUT.
#   (here) ../shared/tools/gpu-bundle --bins --data /usr/share/datasets/fashion-mnist
#          git rev-parse --short HEAD > .gpucarry/COMMIT; tar -cf - .gpu | xz -T2 -3 > .gpucarry/gpu.tar.xz
#   (here, binary only: the bench, profile and variants parts) cargo build --workspace --release --bins;
#          mkdir -p .kbin; xz -T2 -3 -c target/release/kiln > .kbin/kiln.xz (echo /.kbin/ >> .git/info/exclude once); carry [".kbin"]
#   (device tool) carry [".gpucarry"], command: bash bench/gpu_conv.sh [all | comma-separated parts: tests,apis,profile,timing,ab,bench,train,traincpu,cpu]
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; log="$OUT/run.log"
if [ ! -d .gpu ] && [ -f .kbin/kiln.xz ]; then
  # The kiln binary alone (carry [".kbin"]): enough for the bench and profile parts.
  mkdir -p .gpu/bin && xz -dc .kbin/kiln.xz > .gpu/bin/kiln && chmod +x .gpu/bin/kiln
fi
[ -d .gpu ] || xz -dc .gpucarry/gpu.tar.xz | tar -xf -
export KILN_KERNEL_CACHE=/tmp/kiln-kernels KILN_DATA=$PWD/.gpu/data
export KILN_COMMIT=$(cat .gpucarry/COMMIT 2>/dev/null || echo unknown)
cudnn_lib=$(python3 -c 'import nvidia.cudnn as c, os; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=${cudnn_lib}:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
.gpu/bin/kiln info
has() { [ "$what" = all ] || [[ ",$what," == *",$1,"* ]]; }
if has tests; then
  timeout 300 bash .gpu/run-tests.sh > "$OUT/tests.log" 2>&1; echo "tests exit $?"
  grep -E "FAILED|panicked|^test executables" "$OUT/tests.log" | tail -12
  # The same op, gradient and layer tests without cuDNN: the im2col + cuBLASLt path.
  for t in ops_conv grad nn; do
    KILN_CUDNN=0 KILN_REQUIRE_CUDA=1 timeout 120 .gpu/tests/$t-test > /tmp/nocudnn-$t.log 2>&1
    echo "without cuDNN: $t exit $? $(grep -E '^test result' /tmp/nocudnn-$t.log | tail -1)"
  done
  KILN_CUDNN=0 .gpu/bin/kiln info | grep convolutions
fi
if has apis; then
  # Each of cuDNN's APIs on its own (the default measures both and keeps the faster).
  # And kiln's direct kernels wherever they apply (by default they run where they measure faster).
  for mode in KILN_CUDNN_API=graph KILN_CUDNN_API=legacy KILN_CONV_DIRECT=1; do
    for t in ops_conv grad:gradients_ train:cnn; do
      exe=.gpu/tests/${t%%:*}-test; filter=${t#*:}; [ "$filter" = "$t" ] && filter=
      log=/tmp/${mode#*=}-${t%%:*}.log
      env $mode KILN_REQUIRE_CUDA=1 timeout 150 $exe $filter > $log 2>&1
      echo "$mode: $t exit $? $(grep -E '^test result' $log | tail -1)"
      grep -E -A4 "panicked" $log | cut -c1-600 | head -12
    done
  done
fi
if has profile; then
  # Where one call's time goes: kiln's median per call of one problem (SHAPE, PRECISION), then
  # every kernel of the same run under ncu (durations only), PyTorch's kernels for the same
  # call, and the kernels of a few eager CNN training steps.
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  export KILN_BENCH_CONV=${SHAPE:-b64-128x128-28-k3} KILN_BENCH_CONV_PRECISIONS=${PRECISION:-tf32}
  KILN_CUDNN_LOG=1 .gpu/bin/kiln bench run --device cuda --suite conv --out "$OUT/prof_kiln.json" 2>&1 | grep -E "^conv/|chose"
  ncu_csv() { timeout 240 "$ncu_bin" --clock-control none --metrics gpu__time_duration.sum --csv "$@" 2>/dev/null | grep -E '^"[0-9]'; }
  ncu_csv .gpu/bin/kiln bench run --device cuda --suite conv > "$OUT/ncu_conv_kiln.csv"; echo "ncu kiln conv exit $?"
  cat > /tmp/torch_conv_one.py <<'PY'
import torch, os
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = os.environ.get("KILN_BENCH_CONV_PRECISIONS", "tf32") == "tf32"
name = os.environ["KILN_BENCH_CONV"]
b, rest = name.split("-", 1)
ch, size, k = rest.split("-")
n, (cin, cout), size, k = int(b[1:]), map(int, ch.split("x")), int(size), int(k[1:])
dt = torch.bfloat16 if os.environ.get("KILN_BENCH_CONV_PRECISIONS") == "bf16" else torch.float32
x = torch.randn(n, cin, size, size, device="cuda", dtype=dt)
w = torch.randn(cout, cin, k, k, device="cuda", dtype=dt) * 0.1
bias = torch.randn(cout, device="cuda", dtype=dt)
with torch.no_grad():
    for _ in range(40):
        torch.nn.functional.conv2d(x, w, bias, padding=k // 2)
torch.cuda.synchronize()
PY
  ncu_csv python3 /tmp/torch_conv_one.py > "$OUT/ncu_conv_torch.csv"; echo "ncu torch conv exit $?"
  ncu_csv --launch-skip 6000 --launch-count 200 .gpu/bin/kiln train --model cnn --device cuda --graph off --epochs 1 ${TRAIN_ARGS:-} \
    --data .gpu/data --out /tmp/run-prof --quiet > "$OUT/ncu_cnn_eager.csv"; echo "ncu cnn exit $?"
  python3 - "$OUT" <<'PY'
import csv, sys, collections
out = sys.argv[1]
def rows(f):
    r = [l for l in csv.reader(open(f"{out}/{f}"))]
    # ID, Process ID, Process Name, Host Name, Kernel Name, Context, Stream, Block, Grid, Device, CC, Section, Metric Name, Unit, Value
    return [(l[4][:90], float(l[-1].replace(",", ""))) for l in r if len(l) > 10]
for f, tail in [("ncu_conv_kiln.csv", 24), ("ncu_conv_torch.csv", 8)]:
    r = rows(f)
    print(f"== {f}: {len(r)} kernels; the last {tail} (ns):")
    for name, ns in r[-tail:]:
        print(f"{ns:10.0f}  {name}")
r = rows("ncu_cnn_eager.csv")
tot = collections.defaultdict(lambda: [0, 0.0])
for name, ns in r:
    tot[name][0] += 1; tot[name][1] += ns
print(f"== ncu_cnn_eager.csv: {len(r)} kernels, {sum(v[1] for v in tot.values())/1e3:.1f} us total; by kernel:")
for name, (c, ns) in sorted(tot.items(), key=lambda kv: -kv[1][1])[:25]:
    print(f"{ns/1e3:9.1f} us {c:4d}x  {name}")
PY
fi
if has timing; then
  # The conv and cnn suites under each of VARIANTS (in order; "default", or comma-separated
  # VAR=value settings such as KILN_CUDNN_API=graph-first,KILN_CUDNN_TIMING=throughput; a variant
  # may repeat), after one unrecorded warm-up run, then PyTorch's; a table of kiln / PyTorch
  # per run.
  KILN_BENCH_CONV=b64-64x64-56-k3 timeout 100 .gpu/bin/kiln bench run --device cuda --suite conv --out /tmp/warmup.json > /dev/null 2>&1
  runs=()
  for spec in ${VARIANTS:-default KILN_CUDNN_API=graph-first}; do
    i=${#runs[@]}; name=$(echo "${spec##*=}" | tr -c 'a-z0-9\n' '-'); runs+=("$name-$i")
    settings=(); [ "$spec" = default ] || IFS=, read -ra settings <<< "$spec"
    env "${settings[@]}" KILN_CUDNN_LOG=1 timeout 200 .gpu/bin/kiln bench run --device cuda --suite conv,cnn \
      --out "$OUT/kiln_conv_$name-$i.json" > /tmp/bench-$i.out 2>&1; echo "kiln bench ($spec, run $i) exit $?"
    { echo "== run $i: $spec"; grep -E "chose|kiln conv2d|wgrad-mma|few" /tmp/bench-$i.out; } >> "$OUT/choices.txt"
  done
  timeout 200 python3 bench/torch_bench.py --device cuda --suite conv,cnn --out "$OUT/torch_conv.json" >> "$log" 2>&1
  echo "torch bench exit $?"
  python3 - "$OUT" "${runs[@]}" <<'PY'
import json, sys
out, runs = sys.argv[1], sys.argv[2:]
load = lambda f: {r["name"]: r for r in json.load(open(f"{out}/{f}"))["results"]}
kiln = [load(f"kiln_conv_{r}.json") for r in runs]
torch = load("torch_conv.json")
print(f"{'kiln / PyTorch':44} " + " ".join(f"{r:>14}" for r in runs))
for name, t in torch.items():
    if not all(name in k for k in kiln) or not name.startswith(("conv/", "train/")): continue
    rat = [(t["value"] / k[name]["value"]) if t["unit"] in ("ms", "us") else (k[name]["value"] / t["value"]) for k in kiln]
    print(f"{name:44} " + " ".join(f"{x:13.2f}x" for x in rat))
PY
fi
if has bench; then
  KILN_CUDNN_LOG=1 timeout 200 .gpu/bin/kiln bench run --device cuda --suite conv,cnn --out "$OUT/kiln_conv.json" \
    > /tmp/bench.out 2> "$OUT/cudnn_choices.txt"
  echo "kiln bench exit $?"
  timeout 200 python3 bench/torch_bench.py --device cuda --suite conv,cnn --out "$OUT/torch_conv.json" >> "$log" 2>&1
  echo "torch bench exit $?"
  .gpu/bin/kiln bench compare "$OUT/kiln_conv.json" "$OUT/torch_conv.json" | grep -E "conv/|cnn/"
fi
if has ab; then
  # The CNN epoch with kiln's row-staged weight gradient off and on, alternating (AB_RUNS rounds).
  for i in $(seq 1 ${AB_RUNS:-2}); do
    for rows in 0 1; do
      f="$OUT/kiln_cnn_rows$rows-$i.json"
      KILN_CONV_WGRAD_ROWS=$rows timeout 200 .gpu/bin/kiln bench run --device cuda --suite cnn --out "$f" > /dev/null 2>&1
      echo "KILN_CONV_WGRAD_ROWS=$rows run $i (exit $?): $(python3 -c "import json,sys; print(' '.join(f\"{r['name'].split('/')[-1]} {r['value']:.1f}\" for r in json.load(open(sys.argv[1]))['results']))" "$f")"
    done
  done
fi
if has train; then
  run=/tmp/run-cnn
  timeout 150 .gpu/bin/kiln train --model cnn --device cuda --data .gpu/data --out $run --quiet 2>&1 | tee -a "$log" | tail -4
  cp $run/metrics.json "$OUT/kiln_cnn_cuda.json"
  timeout 150 .gpu/bin/kiln train --model cnn --device cuda --graph off --data .gpu/data --out /tmp/run-cnn-eager --quiet 2>&1 | tail -2
  timeout 150 .gpu/bin/kiln train --model cnn --device cuda --tf32 --data .gpu/data --out /tmp/run-cnn-tf32 --quiet 2>&1 | tail -2
  timeout 150 .gpu/bin/kiln train --model cnn --device cuda --tf32 --graph off --data .gpu/data --out /tmp/run-cnn-tf32-eager --quiet 2>&1 | tail -1
  python3 -c "import json; json.dump({k: json.load(open(f'/tmp/run-cnn{k}/metrics.json')) for k in ['-eager', '-tf32', '-tf32-eager']}, open('$OUT/kiln_cnn_cuda_more.json', 'w'))"
  timeout 150 python3 bench/torch_train.py --model cnn --data .gpu/data --device cuda --out "$OUT/torch_cnn_cuda.json" \
    --kiln-checkpoint $run/epoch-10.safetensors 2>&1 | tail -3
fi
if has traincpu; then
  # The acceptance run on the CPU (all 16 cores here; same seed as the CUDA run).
  timeout 400 .gpu/bin/kiln train --model cnn --device cpu --data .gpu/data --out /tmp/run-cnn-cpu --quiet 2>&1 | tail -3
  cp /tmp/run-cnn-cpu/metrics.json "$OUT/kiln_cnn_cpu.json"
fi
if has cpu; then
  # The CI machine's size: two cores for both libraries.
  RAYON_NUM_THREADS=2 timeout 150 taskset -c 0,1 .gpu/bin/kiln bench run --device cpu --suite conv,cnn --out /tmp/kiln_cpu.json >> "$log" 2>&1
  echo "kiln cpu bench exit $?"
  OMP_NUM_THREADS=2 timeout 150 taskset -c 0,1 python3 bench/torch_bench.py --device cpu --suite conv,cnn --out /tmp/torch_cpu.json >> "$log" 2>&1
  echo "torch cpu bench exit $?"
  .gpu/bin/kiln bench compare /tmp/kiln_cpu.json /tmp/torch_cpu.json | grep -E "conv/|cnn/"
  python3 -c "import json,sys; a=json.load(open('/tmp/kiln_cpu.json')); b=json.load(open('/tmp/torch_cpu.json')); json.dump({'kiln':a,'torch':b}, open('$OUT/cpu2.json','w'))"
fi
