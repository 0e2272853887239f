#!/usr/bin/env bash
# Where the recorded MLP step's time goes on the GPU, node by node, and `kiln train`'s first
# epoch with an empty and a warm kernel cache. Leaves $OUT/graph_nodes.txt (per-node GPU time
# and the gaps between nodes, from nsys when the machine has it, else ncu per node) and
# $OUT/first_epoch.txt.
#   (device tool) carry [".gpucarry"], command: bash bench/gpu_graph_profile.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d .gpu ] || xz -dc .gpucarry/gpu.tar.xz | tar -xf -
export KILN_KERNEL_CACHE=/tmp/kiln-kernels KILN_DATA=$PWD/.gpu/data XDG_RUNTIME_DIR=/tmp
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for cache in cold warm; do
  [ $cache = cold ] && rm -rf /tmp/kiln-cold-cache
  KILN_KERNEL_CACHE=/tmp/kiln-cold-cache timeout 200 .gpu/bin/kiln train --device cuda --data .gpu/data \
    --epochs 3 --quiet --out /tmp/run-$cache > /dev/null 2>&1
  python3 -c "import json; e=json.load(open('/tmp/run-$cache/metrics.json'))['epochs']; print('$cache', [round(x['seconds']*1e3,1) for x in e])" | tee -a "$OUT/first_epoch.txt"
done
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${nsys:-none}"
if [ -n "$nsys" ]; then
  timeout 240 "$nsys" profile -t cuda --cuda-graph-trace=node -o /tmp/step -f true \
    .gpu/bin/kiln bench run --device cuda --suite train --quick --out /tmp/q.json > /tmp/nsys.log 2>&1
  echo "nsys exit $?"
  timeout 120 "$nsys" stats --report cuda_gpu_trace --format csv -o /tmp/trace /tmp/step.nsys-rep > /dev/null 2>&1
  ls /tmp/trace* 2>/dev/null; cp /tmp/trace*.csv "$OUT/gpu_trace.csv" 2>/dev/null
  xz -T4 -k "$OUT/gpu_trace.csv" 2>/dev/null && rm -f "$OUT/gpu_trace.csv"
fi
