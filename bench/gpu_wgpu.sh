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
#   (device tool) carry [".gpucarry", ".gl"], command: bash bench/gpu_wgpu.sh [tests | bench | variants | train | all]
#   SUITES=peak,sparse picks the bench suites (default: peak,gemm,elementwise,reduce,softmax,train).
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
