#!/usr/bin/env bash
# Device-machine calls for data-parallel training (issue 14): the GPU test suite with CUDA
# and NCCL required (with two GPUs also KILN_REQUIRE_GPUS=2: the 2-rank tests, the
# process-per-GPU test and its dead-peer case), then `kiln bench dist` beside PyTorch DDP
# (torchrun) on 1 GPU and, when there are two, on 2, in the same call.
#   (here) ../shared/tools/gpu-bundle --bins --data /usr/share/datasets/fashion-mnist
#          git rev-parse --short HEAD > .gpucarry/COMMIT
#          tar -cf - .gpu | xz -T2 --lzma2=preset=4,dict=384MiB > .gpucarry/gpu.tar.xz
#   (device tool, kind nvidia-h200-x2 for two GPUs) carry [".gpucarry"], command:
#          bash bench/gpu_nccl.sh [tests | bench | all | multi | variants], comma-separated
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d .gpu ] || xz -dc .gpucarry/gpu.tar.xz | tar -xf -
export KILN_KERNEL_CACHE=/tmp/kiln-kernels KILN_DATA=$PWD/.gpu/data XDG_RUNTIME_DIR=/tmp
export KILN_REQUIRE_CUDA=1 KILN_REQUIRE_NCCL=1 NCCL_NVLS_ENABLE=0
libdir() { python3 -c "import nvidia.$1 as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null; }
export LD_LIBRARY_PATH=$(libdir nccl):$(libdir cudnn):/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
gpus=$(nvidia-smi -L | wc -l)
[ "$gpus" -ge 2 ] && export KILN_REQUIRE_GPUS=2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -4
.gpu/bin/kiln info | grep -E "^(cuda:|collectives)"
has() { [ "$what" = all ] || [[ ",$what," == *",$1,"* ]]; }
# `multi`: only the executables with multi-rank tests (the rest run in the one-GPU suite).
if [[ ",$what," == *",multi,"* ]]; then
  for t in dist parallel train:data_parallel; do
    exe=.gpu/tests/${t%%:*}-test; filter=${t#*:}; [ "$filter" = "$t" ] && filter=
    [ -x "$exe" ] || { echo "no $exe"; continue; }
    echo "=== $exe $filter"
    timeout ${MULTI_TIMEOUT:-150} env RUST_BACKTRACE=1 NCCL_DEBUG=WARN "$exe" $filter > "$OUT/${t%%:*}.log" 2>&1
    echo "$t exit $?"
    grep -E "^test |test result|panicked|NCCL WARN" "$OUT/${t%%:*}.log" | head -20
  done
fi
if has tests; then
  timeout 540 bash .gpu/run-tests.sh > "$OUT/tests.log" 2>&1; echo "tests exit $?"
  grep -E "FAILED|panicked|^test executables" "$OUT/tests.log" | tail -12
  for t in dist parallel; do grep -A14 "tests/$t-test" "$OUT/tests.log" | grep -E "^test |test result" | head -8; done
fi
# `variants`: kiln's two-GPU training rows under NCCL settings that trade collective bandwidth
# for SMs left to the overlapped GEMMs, or schedule collectives first (VARIANTS="NAME=VALUE ...";
# "default" is unchanged; training rows only).
if [[ ",$what," == *",variants,"* ]] && [ "$gpus" -ge 2 ]; then
  # A variant joins several settings with '+': KILN_NCCL_PRIORITY=high+KILN_GEMM_SM_COUNT=108.
  for v in ${VARIANTS:-default NCCL_MAX_NCHANNELS=8 NCCL_MAX_NCHANNELS=16}; do
    envs=(); [ "$v" != default ] && IFS=+ read -ra envs <<< "$v"
    timeout 120 env "${envs[@]}" .gpu/bin/kiln bench dist --devices cuda:0,cuda:1 --parts train \
      --out "/tmp/variant_$v.jsonl" > "/tmp/variant_$v.log" 2>&1
    echo "variant $v exit $?"
    python3 - "/tmp/variant_$v.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["name"].startswith("train") or r["name"] in ("all_reduce 64 MB", "all_reduce 1 GB"):
        print("  %-50s %12.1f %s" % (r["name"], r["value"], r["unit"]))
PY
  done
fi
if has bench; then
  lists=("cuda:0"); [ "$gpus" -ge 2 ] && lists+=("cuda:0,cuda:1")
  # BENCH_WORLDS=2: only the two-GPU runs (the one-GPU figures from an earlier call).
  [ "${BENCH_WORLDS:-}" = 2 ] && lists=("cuda:0,cuda:1")
  for list in "${lists[@]}"; do
    n=$(( $(tr -cd , <<<"$list" | wc -c) + 1 ))
    timeout 200 .gpu/bin/kiln bench dist --devices "$list" --out "$OUT/kiln_dist_$n.jsonl" > "$OUT/kiln_dist_$n.log" 2>&1
    echo "kiln bench dist $list exit $?"
    timeout 200 torchrun --standalone --nproc_per_node=$n bench/torch_ddp.py --out "$OUT/torch_ddp_$n.jsonl" > "$OUT/torch_ddp_$n.log" 2>&1
    echo "torchrun $n exit $?"
  done
  python3 bench/dist_table.py "$OUT"
fi
