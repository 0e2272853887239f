#!/usr/bin/env bash
# Device-machine calls for the whole H100 table of docs/benchmarks.md: every kiln benchmark
# suite beside bench/torch_bench.py in the same call, in two halves that each fit the device
# tool's 10-minute limit, then `kiln train` beside bench/torch_train.py.
#   (here) the bundle and the Vulkan loader as in bench/gpu_wgpu.sh; carry [".gpucarry", ".gl"]
#   (device tool) bash bench/gpu_table.sh tests,base   then   bash bench/gpu_table.sh rest,train
#   (here) python3 bench/merge_bench.py A.json B.json > kiln_bench.json (and the same for
#          torch_bench.json), then python3 bench/make_report.py GPU_DIR CPU_DIR
# base: peak, gemm, elementwise, activation, reduce, softmax, transfer, overhead, alloc, train;
# rest: conv, cnn, sparse. Results go to $OUT.
set -uo pipefail
what=${1:-tests,base}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; log="$OUT/run.log"
[ -d .gpu ] || xz -dc .gpucarry/gpu.tar.xz | tar -xf -
for f in .gl/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done; ldconfig
[ -f /usr/share/vulkan/icd.d/nvidia_icd.json ] || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export KILN_KERNEL_CACHE=/tmp/kiln-kernels KILN_DATA=$PWD/.gpu/data XDG_RUNTIME_DIR=/tmp
export KILN_COMMIT=$(cat .gpucarry/COMMIT 2>/dev/null || echo unknown)
cudnn_lib=$(python3 -c 'import nvidia.cudnn as c, os; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=${cudnn_lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
.gpu/bin/kiln info | grep -E "^(cuda|wgpu|convolutions)" | head -6
has() { [[ ",$what," == *",$1,"* ]]; }
suites() { # NAME SUITES TIMEOUT: kiln then PyTorch, each into its own JSON
  timeout "$3" .gpu/bin/kiln bench run --device cuda --suite "$2" --out "$OUT/kiln_$1.json" >> "$log" 2>&1
  echo "kiln $1 exit $?"
  timeout "$3" python3 bench/torch_bench.py --device cuda --suite "$2" --out "$OUT/torch_$1.json" >> "$log" 2>&1
  echo "torch $1 exit $?"
  .gpu/bin/kiln bench compare "$OUT/kiln_$1.json" "$OUT/torch_$1.json" > "$OUT/compare_$1.txt"
}
if has tests; then
  KILN_REQUIRE_WGPU=1 timeout 400 bash .gpu/run-tests.sh > "$OUT/tests.log" 2>&1; echo "tests exit $?"
  grep -E "FAILED|panicked|^test executables" "$OUT/tests.log" | tail -12
  grep -A12 "wgpu-test" "$OUT/tests.log" | grep -E "test result" | head -1
fi
has base && suites base peak,gemm,elementwise,activation,reduce,softmax,transfer,overhead,alloc,train 170
has rest && suites rest peak,conv,cnn,sparse 170
if has train; then
  run=/tmp/run-cuda
  timeout 120 .gpu/bin/kiln train --device cuda --data .gpu/data --out $run --quiet 2>&1 | tee -a "$log"
  timeout 120 .gpu/bin/kiln train --device cuda --data .gpu/data --graph off --quiet 2>&1 | sed 's/^/eager: /' >> "$log"
  cp $run/metrics.json "$OUT/kiln_train_cuda.json"; cp $run/curves.png "$OUT/curves_cuda.png"
  timeout 150 python3 bench/torch_train.py --data .gpu/data --device cuda --out "$OUT/torch_train_cuda.json" \
    --kiln-checkpoint $run/epoch-10.safetensors 2>&1 | tail -4 | tee -a "$log"
fi
