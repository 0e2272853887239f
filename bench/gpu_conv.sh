#!/usr/bin/env bash
# One device-machine call for the convolutional-networks work: every test with CUDA required
# (or only FILTER's), the conv tests again with each cuDNN API alone and with kiln's direct kernels forced (apis), the `conv` and `cnn` suites of kiln and PyTorch (CUDA, then 2 CPU cores),
# `kiln train --model cnn` with graphs and eagerly beside PyTorch, and the kiln checkpoint
# scored in PyTorch. At most 8 files come back in $OUT.
#   (here) ../shared/tools/gpu-bundle --bins --data /usr/share/datasets/fashion-mnist
#          git rev-parse --short HEAD > .gpucarry/COMMIT; tar -cf - .gpu | xz -T2 -3 > .gpucarry/gpu.tar.xz
#   (device tool) carry [".gpucarry"], command: bash bench/gpu_conv.sh [all | comma-separated parts: tests,apis,bench,train,traincpu,cpu]
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; log="$OUT/run.log"
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
if has bench; then
  KILN_CUDNN_LOG=1 timeout 200 .gpu/bin/kiln bench run --device cuda --suite conv,cnn --out "$OUT/kiln_conv.json" \
    > /tmp/bench.out 2> "$OUT/cudnn_choices.txt"
  echo "kiln bench exit $?"
  timeout 200 python3 bench/torch_bench.py --device cuda --suite conv,cnn --out "$OUT/torch_conv.json" >> "$log" 2>&1
  echo "torch bench exit $?"
  .gpu/bin/kiln bench compare "$OUT/kiln_conv.json" "$OUT/torch_conv.json" | grep -E "conv/|cnn/"
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
