# Sourced by device-machine scripts (with OUT set): unpacks the carried bundle
# (.gpucarry/gpu.tar.xz) unless .gpu is there, sets the kernel cache, the data folder and the
# library path (cuDNN and NCCL from PyTorch's Python environment, cuBLAS and cuSPARSE from
# CUDA's), prints the GPU, and defines `run_tests [SECONDS]`: the whole GPU test suite with
# CUDA and NCCL required, its log in $OUT/tests.log and its summary printed.
[ -d .gpu ] || xz -dc .gpucarry/gpu.tar.xz | tar -xf -
export KILN_KERNEL_CACHE=/tmp/kiln-kernels KILN_DATA=$PWD/.gpu/data XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1
export KILN_COMMIT=$(cat .gpucarry/COMMIT 2>/dev/null || echo unknown)
libdir() { python3 -c "import nvidia.$1 as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null; }
export LD_LIBRARY_PATH=$(libdir nccl):$(libdir cudnn):/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
run_tests() {
  KILN_REQUIRE_CUDA=1 KILN_REQUIRE_NCCL=1 NCCL_NVLS_ENABLE=0 timeout "${1:-420}" bash .gpu/run-tests.sh > "$OUT/tests.log" 2>&1
  echo "tests exit $?"; grep -E "FAILED|panicked|^test executables" "$OUT/tests.log" | tail -12
}
