#!/usr/bin/env bash
# Device-machine call (its Xeon has AVX-512, which this repo's CPU hosts may lack): two
# cpu_micro builds alternated on two pinned cores, `cpu_micro conv` on the CNN's layers and
# the 14² 5×5 input gradient's shape (64→32). FWD_ONLY=1: the forwards alone (the
# gradients' figures are differences of two timings, noisier on a shared host).
#   (here) strip + xz two builds into .kbin/cm_old.xz and .kbin/cm_new.xz; carry [".kbin"]
#   (device tool) bash bench/tools/cpu_micro/device_ab.sh [ROUNDS]
set -u
for v in old new; do xz -dc .kbin/cm_$v.xz > /tmp/cm_$v && chmod +x /tmp/cm_$v; done
lscpu | grep -E "Model name|^CPU\(s\)"; grep -o -m1 "avx512f" /proc/cpuinfo
for r in $(seq ${1:-3}); do
  for v in old new; do
    echo "== round $r: $v"
    for shape in 256,32,14,64,5,2 256,64,14,32,5,2 256,1,28,32,5,2; do
      CONV=$shape THREADS=2 taskset -c 2,3 /tmp/cm_$v conv
    done
  done
done
