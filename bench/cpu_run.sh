#!/usr/bin/env bash
# The CPU side of the benchmarks, on this machine: kiln and PyTorch (CPU) benchmarks with their
# comparison, and `kiln train` beside PyTorch eager training on the CPU.
#   bash bench/cpu_run.sh OUTDIR [PYTHON]   (PYTHON: an interpreter with torch, numpy, safetensors)
# SUITES=peak,gemm,... limits the benchmark suites (default: all); BEFORE=path/to/old/kiln also
# runs an older build's benchmarks first, for `bench/cpu_report.py BEFORE AFTER TORCH`.
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
$kiln bench run --device cpu "${suites[@]}" --out "$OUT/kiln_bench_cpu.json" > "$OUT/bench_cpu.log" 2>&1; echo "kiln bench exit $?"
$PY bench/torch_bench.py --device cpu "${suites[@]}" --out "$OUT/torch_bench_cpu.json" >> "$OUT/bench_cpu.log" 2>&1; echo "torch bench exit $?"
$kiln bench compare "$OUT/kiln_bench_cpu.json" "$OUT/torch_bench_cpu.json" > "$OUT/compare_cpu.txt"
if [ -n "${BEFORE:-}" ]; then
  $PY bench/cpu_report.py "$OUT/kiln_before_cpu.json" "$OUT/kiln_bench_cpu.json" "$OUT/torch_bench_cpu.json" > "$OUT/report_cpu.md"
fi
run=$(mktemp -d)
$kiln train --device cpu --out "$run" --quiet 2>&1 | tee "$OUT/train_cpu.log"
cp "$run/metrics.json" "$OUT/kiln_train_cpu.json"; cp "$run/curves.png" "$OUT/curves_cpu.png"
$PY bench/torch_train.py --device cpu --out "$OUT/torch_train_cpu.json" \
  --kiln-checkpoint "$run/epoch-10.safetensors" 2>&1 | tee -a "$OUT/train_cpu.log"
