#!/usr/bin/env bash
# One-GPU call for issue 14 (when the 2-GPU kind is not lent) plus the racecheck runs left
# from issue 15: `kiln bench dist` beside PyTorch DDP on one GPU, the dist/parallel/train
# tests with CUDA and NCCL required (one-rank NCCL communicators, graphs included), and
# racecheck of threads-test (8 iterations, kiln's kernels) and of the three tests whose
# cuBLAS kernels fault when excluded from instrumentation (here with every kernel).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d .gpu ] || xz -dc .gpucarry/gpu.tar.xz | tar -xf -
export KILN_KERNEL_CACHE=/tmp/kiln-kernels KILN_DATA=$PWD/.gpu/data XDG_RUNTIME_DIR=/tmp
export KILN_REQUIRE_CUDA=1 KILN_REQUIRE_NCCL=1 NCCL_NVLS_ENABLE=0 KILN_THREADS_ITERS=8
libdir() { python3 -c "import nvidia.$1 as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null; }
export LD_LIBRARY_PATH=$(libdir nccl):$(libdir cudnn):/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
.gpu/bin/kiln info | grep -E "^(cuda:|collectives)"
timeout 200 .gpu/tests/cuda-test every_kernel_source > /dev/null 2>&1 &
timeout 150 .gpu/bin/kiln bench dist --devices cuda:0 --out "$OUT/kiln_dist_1.jsonl" > "$OUT/kiln_dist_1.log" 2>&1; echo "kiln bench dist exit $?"
timeout 150 torchrun --standalone --nproc_per_node=1 bench/torch_ddp.py --out "$OUT/torch_ddp_1.jsonl" > "$OUT/torch_ddp_1.log" 2>&1; echo "torchrun exit $?"
python3 bench/dist_table.py "$OUT"
wait
rc() { timeout 300 compute-sanitizer --tool racecheck --print-limit 50 "${@:3}" ".gpu/tests/$1" --exact "$2" > "$OUT/racecheck-$2.txt" 2>&1; echo "racecheck $1 $2 exit $? $(grep -E 'RACECHECK SUMMARY|Internal' "$OUT/racecheck-$2.txt" | tr '\n' ' ')" >> "$OUT/racecheck.txt"; }
excl=(--kernel-name-exclude regex=^_Z); for k in xmma cutlass gemm gemv nvjet cudnn cublas cusparse; do excl+=(--kernel-name-exclude "kns=$k"); done
rc threads-test threads_share_tensors_safely "${excl[@]}" &
rc cuda-test tf32_is_opt_in &
rc ops_matmul_index-test matmul_2d_on_every_layout_pair &
rc ops_matmul_index-test matmul_bias_and_row_sums_match_reference &
for t in dist parallel; do timeout 150 .gpu/tests/$t-test > "$OUT/$t.log" 2>&1; echo "$t-test exit $?"; grep -E "^test |test result|panicked" "$OUT/$t.log"; done
timeout 150 .gpu/tests/train-test data_parallel > "$OUT/train.log" 2>&1; echo "train-test data_parallel exit $?"; grep -E "test result" "$OUT/train.log"
wait
cat "$OUT/racecheck.txt"
