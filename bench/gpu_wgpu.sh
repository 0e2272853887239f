#!/usr/bin/env bash
# Device-machine calls for the wgpu backend (issue 13): the whole test suite with CUDA and
# wgpu required (wgpu on the H100 through NVIDIA's Vulkan driver), then kiln's benchmark
# suites on wgpu beside kiln's CUDA backend in the same call, and training on both.
#   (here, once) the Vulkan loader, which the GPU machine lacks:
#          echo /.gl/ >>.git/info/exclude; mkdir -p .gl /tmp/amd64/partial
#          o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
#          apt-get $o update; (cd .gl && apt-get $o download libvulkan1 libglvnd0 libgl1 libglx0 libegl1 libgles2 libopengl0)
#          (without the glvnd libraries NVIDIA's ICD, libGLX_nvidia, fails: "Found no drivers")
#   (here) ../shared/tools/gpu-bundle --bins --data /usr/share/datasets/fashion-mnist
#          rm -f .gpu/tests/bench_plot-test .gpu/tests/cpu_math-test; git rev-parse --short HEAD > .gpucarry/COMMIT
#          tar -cf - .gpu | xz -T1 --lzma2=preset=6,dict=384MiB > .gpucarry/gpu.tar.xz   # the binaries share most code
#   (here, binary only: the bench, profile and variants parts) cargo build --workspace --release --bins;
#          mkdir -p .kbin; xz -T2 -3 -c target/release/kiln > .kbin/kiln.xz (echo /.kbin/ >> .git/info/exclude once); carry [".kbin", ".gl"]
#   (device tool) carry [".gpucarry", ".gl"], command: bash bench/gpu_wgpu.sh [tests | bench | isolated | variants | train | all]
#   SUITES=peak,sparse picks the bench suites (default: peak,gemm,elementwise,reduce,softmax,train).
#   "isolated" runs each suite in a process of its own on each backend, with the SM clock
#   sampled (NVIDIA's Vulkan driver lowers it in a process that leaves the GPU mostly idle:
#   bench/results/2026-11-26j-h100-wgpu-clock), and merges the reports into kiln_{cuda,wgpu}.json.
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ ! -d .gpu ] && [ -f .kbin/kiln.xz ]; then
  # The kiln binary alone (carry [".kbin", ".gl"]): enough for the bench and variants parts.
  mkdir -p .gpu/bin && xz -dc .kbin/kiln.xz > .gpu/bin/kiln && chmod +x .gpu/bin/kiln
fi
[ -d .gpu ] || xz -dc .gpucarry/gpu.tar.xz | tar -xf -
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
[ -f /usr/share/vulkan/icd.d/nvidia_icd.json ] || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export KILN_KERNEL_CACHE=/tmp/kiln-kernels KILN_DATA=$PWD/.gpu/data XDG_RUNTIME_DIR=/tmp
export KILN_COMMIT=$(cat .gpucarry/COMMIT 2>/dev/null || echo unknown)
cudnn_lib=$(python3 -c 'import nvidia.cudnn as c, os; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=${cudnn_lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
.gpu/bin/kiln info | grep -E "^(cuda|wgpu):"
has() { [ "$what" = all ] || [[ ",$what," == *",$1,"* ]]; }
if has tests; then
  KILN_REQUIRE_WGPU=1 timeout 500 bash .gpu/run-tests.sh > "$OUT/tests.log" 2>&1; echo "tests exit $?"
  grep -E "FAILED|panicked|^test executables" "$OUT/tests.log" | tail -12
  grep -A12 "wgpu-test" "$OUT/tests.log" | grep -E "test result" | head -1
fi
if has bench; then
  suites=${SUITES:-peak,gemm,elementwise,reduce,softmax,train}
  for d in cuda wgpu; do
    timeout 240 .gpu/bin/kiln bench run --device $d --suite $suites --out "$OUT/kiln_$d.json" > "$OUT/bench_$d.log" 2>&1
    echo "kiln bench $d exit $?"
  done
  python3 - "$OUT" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda dev: {r["name"]: r for r in json.load(open(f"{d}/kiln_{dev}.json"))["results"]}
c, w = load("cuda"), load("wgpu")
print(f"{'row':42} {'cuda ms':>10} {'wgpu ms':>10} {'cuda':>14} {'wgpu':>14} {'wgpu/cuda':>9}")
for name in w:
    if name not in c:
        print(f"{name:42} {'':>10} {w[name]['median_ms']:10.4f} {'':>14} {w[name]['value']:9.2f} {w[name]['unit']:>4}")
        continue
    a, b = c[name], w[name]
    print(f"{name:42} {a['median_ms']:10.4f} {b['median_ms']:10.4f} {a['value']:9.2f} {a['unit']:>4} {b['value']:9.2f} {b['unit']:>4} {a['median_ms'] / b['median_ms']:9.2f}")
PY
fi
if [[ ",$what," == *",isolated,"* ]]; then
  suites=${SUITES:-peak,gemm,elementwise,reduce,softmax,train}
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw --format=csv -lms 250 > "$OUT/smi.csv" &
  smi=$!
  for d in cuda wgpu; do
    parts=()
    for s in ${suites//,/ }; do
      f="$OUT/kiln_${d}_$s.json"
      timeout 200 .gpu/bin/kiln bench run --device $d --suite $s --out "$f" > "$OUT/bench_${d}_$s.log" 2>&1
      echo "kiln bench $d $s exit $? ($(date +%T))"; parts+=("$f")
    done
    python3 bench/merge_bench.py "${parts[@]}" > "$OUT/kiln_$d.json"
  done
  kill $smi
  python3 bench/wgpu_table.py "$OUT/kiln_cuda.json" "$OUT/kiln_wgpu.json"
  python3 - "$OUT/smi.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1]))][1:]
sm = sorted(int(r[1].split()[0]) for r in rows if r[1].strip().split()[0].isdigit())
if sm:
    print(f"SM clock over the run: {len(sm)} samples, min {sm[0]}, median {sm[len(sm)//2]}, max {sm[-1]} MHz; "
          f"{sum(v < 1900 for v in sm)} samples below 1900 MHz")
PY
fi
if has variants; then
  # The matmul kernels forced in turn (KILN_WGPU_MATMUL, see backend/wgpu/matmul.rs; "auto" =
  # the default choice), each with the gemm suite on wgpu, one process each.
  for v in ${MM_VARIANTS:-large medium small auto}; do
    f="$OUT/wgpu_gemm_$v.json"; [ -f "$f" ] && f="${f%.json}-again.json"
    KILN_WGPU_MATMUL=$v timeout 150 .gpu/bin/kiln bench run --device wgpu --suite gemm --out "$f" > /dev/null 2>&1
    echo "$v (exit $?): $(python3 -c "import json,sys; print(' '.join(f\"{r['name'][5:]} {r['value']:.2f}\" for r in json.load(open(sys.argv[1]))['results'] if '/f32/' in r['name'] or r['name'].endswith('4096/nn')))" "$f")"
  done
fi
if has train; then
  for d in cuda wgpu; do
    timeout 200 .gpu/bin/kiln train --device $d --epochs 3 --data .gpu/data --out "$OUT/train_$d" 2>&1 | tail -4
  done
fi
