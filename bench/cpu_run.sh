#!/usr/bin/env bash
# The CPU side of the benchmarks, on this machine: kiln and PyTorch (CPU) benchmarks with their
# comparison, and `kiln train` beside PyTorch eager training on the CPU.
#   bash bench/cpu_run.sh OUTDIR [PYTHON]   (PYTHON: an interpreter with torch, numpy, safetensors)
# SUITES=peak,gemm,... limits the benchmark suites (default: all); BEFORE=path/to/old/kiln also
# runs an older build's benchmarks first, for `bench/cpu_report.py BEFORE AFTER TORCH`.
# REPEATS=N (default 3): every suite but cnn (whose epochs take minutes; it runs once) runs N
# times for each library, kiln and PyTorch alternating suite by suite (ABBA order over the
# repeats, and from one suite to the next), and each library's rows are the medians over its
# runs (bench/median_bench.py; the single runs stay in OUT/runs/). On a shared host, memory
# bandwidth moves between minutes, and one run each compared two different machines; whole
# runs of every suite put minutes between a row's kiln and PyTorch figures, one suite at a
# time seconds.
# PyTorch for the CPU: `python3 -m venv V && V/bin/pip install torch numpy safetensors` (the
# PyPI wheel runs on a machine without a GPU).
set -uo pipefail
OUT=${1:?output directory}; PY=${2:-python3}
mkdir -p "$OUT"
export KILN_COMMIT=${KILN_COMMIT:-$(git rev-parse --short HEAD)}
cargo build --release -q -p kiln-cli
kiln=target/release/kiln
suites=(); [ -n "${SUITES:-}" ] && suites=(--suite "$SUITES")
if [ -n "${BEFORE:-}" ]; then
  "$BEFORE" bench run --device cpu "${suites[@]}" --out "$OUT/kiln_before_cpu.json" > "$OUT/bench_before.log" 2>&1; echo "kiln (before) bench exit $?"
fi
all_suites=peak,gemm,elementwise,activation,reduce,softmax,transfer,overhead,alloc,train,conv,cnn,sparse
IFS=, read -ra wanted <<< "${SUITES:-$all_suites}"
kernel_suites=(); epoch_suites=()
for s in "${wanted[@]}"; do
  case $s in cnn) epoch_suites+=("$s") ;; *) kernel_suites+=("$s") ;; esac
done
join() { local IFS=,; echo "$*"; }
REPEATS=${REPEATS:-3}
mkdir -p "$OUT/runs"; : > "$OUT/bench_cpu.log"
kiln_run() { $kiln bench run --device cpu --suite "$1" --out "$2" >> "$OUT/bench_cpu.log" 2>&1; echo "kiln bench ($1) exit $?"; }
torch_run() { $PY bench/torch_bench.py --device cpu --suite "$1" --out "$2" >> "$OUT/bench_cpu.log" 2>&1; echo "torch bench ($1) exit $?"; }
kiln_parts=(); torch_parts=()
if [ ${#kernel_suites[@]} -gt 0 ]; then
  # This call's runs by name (not a glob: files left in OUT by an earlier call stay out).
  kiln_runs=(); torch_runs=()
  for i in $(seq 1 "$REPEATS"); do
    kiln_parts_i=(); torch_parts_i=()
    for j in "${!kernel_suites[@]}"; do
      s=${kernel_suites[$j]}
      kiln_parts_i+=("$OUT/runs/kiln_${i}_$s.json"); torch_parts_i+=("$OUT/runs/torch_${i}_$s.json")
      if [ $(((i + j) % 2)) -eq 1 ]; then
        kiln_run "$s" "${kiln_parts_i[-1]}"; torch_run "$s" "${torch_parts_i[-1]}"
      else
        torch_run "$s" "${torch_parts_i[-1]}"; kiln_run "$s" "${kiln_parts_i[-1]}"
      fi
    done
    kiln_runs+=("$OUT/runs/kiln_$i.json"); torch_runs+=("$OUT/runs/torch_$i.json")
    $PY bench/merge_bench.py "${kiln_parts_i[@]}" > "${kiln_runs[-1]}"
    $PY bench/merge_bench.py "${torch_parts_i[@]}" > "${torch_runs[-1]}"
  done
  $PY bench/median_bench.py "${kiln_runs[@]}" > "$OUT/runs/kiln_kernels.json"
  $PY bench/median_bench.py "${torch_runs[@]}" > "$OUT/runs/torch_kernels.json"
  kiln_parts+=("$OUT/runs/kiln_kernels.json"); torch_parts+=("$OUT/runs/torch_kernels.json")
fi
if [ ${#epoch_suites[@]} -gt 0 ]; then
  e=$(join "${epoch_suites[@]}")
  kiln_run "$e" "$OUT/runs/kiln_epochs.json"; torch_run "$e" "$OUT/runs/torch_epochs.json"
  kiln_parts+=("$OUT/runs/kiln_epochs.json"); torch_parts+=("$OUT/runs/torch_epochs.json")
fi
$PY bench/merge_bench.py "${kiln_parts[@]}" > "$OUT/kiln_bench_cpu.json"
$PY bench/merge_bench.py "${torch_parts[@]}" > "$OUT/torch_bench_cpu.json"
$kiln bench compare "$OUT/kiln_bench_cpu.json" "$OUT/torch_bench_cpu.json" > "$OUT/compare_cpu.txt"
if [ -n "${BEFORE:-}" ]; then
  $PY bench/cpu_report.py "$OUT/kiln_before_cpu.json" "$OUT/kiln_bench_cpu.json" "$OUT/torch_bench_cpu.json" > "$OUT/report_cpu.md"
fi
run=$(mktemp -d)
$kiln train --device cpu --out "$run" --quiet 2>&1 | tee "$OUT/train_cpu.log"
cp "$run/metrics.json" "$OUT/kiln_train_cpu.json"; cp "$run/curves.png" "$OUT/curves_cpu.png"
$PY bench/torch_train.py --device cpu --out "$OUT/torch_train_cpu.json" \
  --kiln-checkpoint "$run/epoch-10.safetensors" 2>&1 | tee -a "$OUT/train_cpu.log"
