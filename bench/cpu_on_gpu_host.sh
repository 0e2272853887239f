#!/usr/bin/env bash
# CPU kernels on two cores of the GPU machine's Xeon (AVX-512), which this repository's own
# machine may lack: the accuracy test at every SIMD level there, then kiln's activation suite
# (an old and a new binary) beside PyTorch CPU, alternating, all pinned to cores 0-1.
#   (here) cargo test --release -p kiln --test cpu_math --no-run; mkdir -p .kbin; copy that
#          executable to .kbin/cpu_math-test, target/release/kiln to .kbin/kiln-new, an older
#          build to .kbin/kiln-old, bench/tools/cpu_micro's binary to .kbin/cpu_micro-new;
#          (cd .kbin && tar -cf - * | xz -T2 -3 > ../kbin.tar.xz) && rm .kbin/* && mv kbin.tar.xz .kbin/
#   (device tool) carry [".kbin"], command: bash bench/cpu_on_gpu_host.sh [ROUNDS] [SUITES]
set -uo pipefail
rounds=${1:-3}; suites=${2:-activation}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f .kbin/kbin.tar.xz ] && xz -dc .kbin/kbin.tar.xz | tar -xf - -C .kbin
lscpu | grep -E "Model name|Flags" | sed 's/\(Flags:.\{0,40\}\).*\(avx512[a-z]*\).*/\1 ... \2 .../'
pin="taskset -c 0,1"; export RAYON_NUM_THREADS=2 OMP_NUM_THREADS=2
timeout 300 $pin .kbin/cpu_math-test --nocapture 2>&1 | grep -E "gelu|test result|panicked" | tee "$OUT/cpu_math.log"
for c in 0 1; do
  echo "core $c, one thread: $(RAYON_NUM_THREADS=1 KILN_CPU_HOT_HELPER=0 taskset -c $c .kbin/cpu_micro-new unary 1048576 | grep -E '^(copy|exp|gelu) ' | awk '{print $1, $2, "ns/elem"}' | tr '\n' ' ')"
done
for i in $(seq 1 "$rounds"); do
  $pin .kbin/kiln-new bench run --device cpu --suite "$suites" --out "$OUT/kiln_after_$i.json" > /dev/null 2>&1
  $pin python3 bench/torch_bench.py --device cpu --suite "$suites" --out "$OUT/torch_$i.json" > /dev/null 2>&1
  $pin .kbin/kiln-old bench run --device cpu --suite "$suites" --out "$OUT/kiln_before_$i.json" > /dev/null 2>&1
  echo "round $i done"
done
for i in $(seq 1 "$rounds"); do
  .kbin/kiln-new bench compare "$OUT/kiln_before_$i.json" "$OUT/torch_$i.json" | grep -E "gelu/f32/1048576|copy" | sed 's/^/before /'
  .kbin/kiln-new bench compare "$OUT/kiln_after_$i.json" "$OUT/torch_$i.json" | grep -E "gelu/|copy" | sed 's/^/after  /'
done
