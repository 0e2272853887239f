#!/usr/bin/env bash
# Probes of wgpu bandwidth on the GPU machine (issue 13), each a fresh `kiln bench` process on
# wgpu alone; run after `bench/gpu_wgpu.sh` has unpacked the binary and the Vulkan loader:
#   bash bench/gpu_wgpu.sh none; bash bench/tools/wgpu_probe.sh reduce,alone,memory,vec4
# Prints one line per row: probe, row, ms, GB/s.
set -uo pipefail
what=${1:-reduce,alone,vec4}
OUT=${OUT:-/tmp/out}/probe; mkdir -p "$OUT"
has() { [[ ",$what," == *",$1,"* ]]; }
run() { # label, env..., -- suites sizes
  local label=$1; shift; local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" KILN_BENCH_SIZES=$2 timeout 120 .gpu/bin/kiln bench run --device wgpu --suite "$1" \
    --out "$OUT/$label.json" > "$OUT/$label.log" 2>&1 || echo "$label: exit $?"
  python3 -c "
import json,sys
for r in json.load(open(sys.argv[1]))['results']:
    if r['suite'] != 'peak': print(f\"{sys.argv[2]:24} {r['name']:36} {r['median_ms']:8.4f} ms {r['value']:8.1f} {r['unit']}\")
" "$OUT/$label.json" "$label"
}
if has reduce; then
  for cfg in "1 4096" "4 4096" "2 4096" "4 2048" "4 16384" "1 16384"; do
    set -- $cfg
    run "reduce-u$1-c$2" KILN_WGPU_REDUCE_UNROLL=$1 KILN_WGPU_REDUCE_CHUNK=$2 -- reduce 16M,64M
  done
fi
if has alone; then
  # Each size in a process of its own, then all in one: does the fall-off follow the size of
  # the operands or the memory the process has allocated before?
  for n in 32M 40M 48M 64M; do run "add-alone-$n" X=1 -- elementwise $n; done
  run "add-all" X=1 -- elementwise 16M,32M,48M,64M,32M,16M
fi
if has memory; then
  # Does the slowdown follow the device memory the process holds? A ballast kept allocated,
  # and the suites with the cache given back to the driver between them.
  run "fresh" X=1 -- elementwise 16M,64M
  for mib in 1024 2048 4096; do run "ballast-${mib}MiB" KILN_BENCH_BALLAST_MIB=$mib -- elementwise 16M,64M; done
  run "suites" X=1 -- elementwise,activation,reduce 16M,48M,64M
  run "suites-release" KILN_BENCH_RELEASE=1 -- elementwise,activation,reduce 16M,48M,64M
fi
if has order; then
  # Is the slow state global (later rows slow whatever their buffers) or the placement of
  # the buffers allocated later? And does CUDA show it?
  run "order-64-16-64-16" X=1 -- elementwise 64M,16M,64M,16M
  run "order-novec4" KILN_WGPU_VEC4=0 -- elementwise 16M,32M,48M,64M,32M,16M
  KILN_BENCH_SIZES=16M,32M,48M,64M,32M,16M timeout 120 .gpu/bin/kiln bench run --device cuda \
    --suite elementwise --out "$OUT/order-cuda.json" > "$OUT/order-cuda.log" 2>&1
  grep -E "^elementwise/add" "$OUT/order-cuda.log" | sed 's/^/order-cuda               /'
  nvidia-smi -q -d PERFORMANCE | grep -iE "throttle|slowdown|active" | grep -v "Not Active" | head -8
fi
if has vec4; then
  run "act-16M" X=1 -- activation 16M
  run "act-16M-novec4" KILN_WGPU_VEC4=0 -- activation 16M
  run "add-16M-novec4" KILN_WGPU_VEC4=0 -- elementwise 16M
fi
