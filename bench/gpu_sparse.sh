#!/usr/bin/env bash
# One device-machine call for the sparse work: every test with CUDA required (or none with
# `bench` alone), the `sparse` suite of kiln and PyTorch (torch.sparse_csr) on CUDA, the SpMV
# lane count swept on each matrix, PageRank on the 1M power-law graph on CUDA and on the
# host's CPU (ranks compared), and the graph-convolution example on CUDA.
#   (here) ../shared/tools/gpu-bundle --bins
#          cargo build --release -p kiln --example graph_conv && cp target/release/examples/graph_conv .gpu/bin/
#          git rev-parse --short HEAD > .gpucarry/COMMIT; tar -cf - .gpu | xz -T2 -3 > .gpucarry/gpu.tar.xz
#   (device tool) carry [".gpucarry"], command: bash bench/gpu_sparse.sh [all | tests,bench,engines,lanes,pagerank,example,ncu]
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; log="$OUT/run.log"
[ -d .gpu ] || xz -dc .gpucarry/gpu.tar.xz | tar -xf -
export KILN_KERNEL_CACHE=/tmp/kiln-kernels KILN_DATA=$PWD/.gpu/data
export KILN_COMMIT=$(cat .gpucarry/COMMIT 2>/dev/null || echo unknown)
cudnn_lib=$(python3 -c 'import nvidia.cudnn as c, os; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=${cudnn_lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
.gpu/bin/kiln info
has() { [ "$what" = all ] || [[ ",$what," == *",$1,"* ]]; }
if has tests; then
  timeout 300 bash .gpu/run-tests.sh > "$OUT/tests.log" 2>&1; echo "tests exit $?"
  grep -E "FAILED|panicked|^test executables" "$OUT/tests.log" | tail -12
  grep -A3 "sparse-" "$OUT/tests.log" | grep -E "test result" | head -2
fi
if has bench; then
  KILN_SPARSE_LOG=1 timeout 240 .gpu/bin/kiln bench run --device cuda --suite sparse --out "$OUT/kiln_sparse.json" > /tmp/kb.out 2>&1
  echo "kiln bench exit $?"; grep "kiln sparse:" /tmp/kb.out
  timeout 240 python3 bench/torch_bench.py --device cuda --suite sparse --out "$OUT/torch_sparse.json" >> "$log" 2>&1
  echo "torch bench exit $?"
  .gpu/bin/kiln bench compare "$OUT/kiln_sparse.json" "$OUT/torch_sparse.json" | grep -E "peak|sparse/"
fi
if has engines; then
  # kiln's kernels alone and cuSPARSE alone (where it applies), beside the measured choice.
  for e in kiln cusparse; do
    KILN_SPARSE_ENGINE=$e timeout 200 .gpu/bin/kiln bench run --device cuda --suite sparse --out "$OUT/kiln_sparse_$e.json" > /dev/null 2>&1
    echo "engine $e exit $?"
  done
  python3 - "$OUT" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda f: {r["name"]: r for r in json.load(open(f"{d}/{f}"))["results"] if r["name"].startswith("sparse")}
a, k, c, t = load("kiln_sparse.json"), load("kiln_sparse_kiln.json"), load("kiln_sparse_cusparse.json"), load("torch_sparse.json")
print(f"{'row':28} {'chosen us':>10} {'kiln us':>10} {'cusparse us':>12} {'torch us':>10}")
for name in a:
    print(f"{name:28} {a[name]['median_ms']*1e3:10.1f} {k[name]['median_ms']*1e3:10.1f} {c[name]['median_ms']*1e3:12.1f} {t[name]['median_ms']*1e3:10.1f}")
PY
fi
if has lanes; then
  # Threads per row of the SpMV kernel, forced: which count wins on each matrix.
  for l in 1 2 4 8 16 32; do
    KILN_SPMV_LANES=$l timeout 100 .gpu/bin/kiln bench run --device cuda --suite sparse --quick \
      --out /tmp/lanes-$l.json > /dev/null 2>&1
    python3 -c "import json; r=json.load(open('/tmp/lanes-$l.json'))['results']; print('lanes $l', ' '.join(f\"{x['name'].split('/')[1]}:{x['median_ms']*1e3:.0f}us\" for x in r if x['name'].endswith('spmv')))"
  done
fi
if has pagerank; then
  timeout 120 .gpu/bin/kiln pagerank --generate powerlaw:1000000 --device cuda --out /tmp/pr-cuda.txt 2>&1 | tail -2
  timeout 120 .gpu/bin/kiln pagerank --generate powerlaw:1000000 --device cuda --dtype f32 --tol 1e-6 2>&1 | tail -1
  RAYON_NUM_THREADS=2 timeout 200 taskset -c 0,1 .gpu/bin/kiln pagerank --generate powerlaw:1000000 --device cpu --out /tmp/pr-cpu.txt 2>&1 | tail -1
  python3 -c "
a=[float(l.split()[1]) for l in open('/tmp/pr-cuda.txt')]; b=[float(l.split()[1]) for l in open('/tmp/pr-cpu.txt')]
print(f'pagerank cuda vs cpu: {len(a)} ranks, max abs diff {max(abs(x-y) for x,y in zip(a,b)):.3e}, max rel diff {max(abs(x-y)/y for x,y in zip(a,b)):.3e}, sums {sum(a):.12f} {sum(b):.12f}')"
fi
if has example; then
  timeout 120 .gpu/bin/graph_conv cuda 2>&1 | tail -7
fi
if has ncu; then
  # Where the SpMV and SpMM row kernels stand against DRAM and L2 limits: one launch each,
  # after the launches that measure threads per row.
  metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__t_sector_hit_rate.pct,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active,launch__block_size,launch__grid_size
  for m in cycle random16 powerlaw; do
    for k in spmv:60 spmm:30; do
      KILN_BENCH_MATRICES=$m timeout 200 ncu --kernel-name regex:"${k%%:*}_rows" --launch-skip ${k##*:} --launch-count 1 --csv \
        --metrics $metrics .gpu/bin/kiln bench run --device cuda --suite sparse 2>/dev/null > /tmp/ncu.csv
      python3 - "$m" /tmp/ncu.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[2]) if l.startswith('"'))]
head, data = rows[0], rows[1:]
ni, vi = head.index("Metric Name"), head.index("Metric Value")
print(sys.argv[1], data[0][head.index("Kernel Name")] if data else "no launch profiled", " ".join(f"{r[ni].split('.')[0]}={r[vi]}" for r in data))
PY
    done
  done
fi
