#!/usr/bin/env bash
# Device-machine call: harness.cu built for each variant V names ("name:-Dflag,-Dflag ..."; a
# name starting with "prev" builds against prev/window.cu), run alternately twice. Default:
# the previous kernels file against the working tree's.
#   bash bench/tools/conv_direct/variants.sh
set -u
I=crates/kiln/src/backend/cuda/kernels
V=${V:-"prev: cur:"}
# prev: the kernels file in bench/tools/conv_direct/prev/ (ignored by git; put there by hand,
# e.g. `git show REV:crates/kiln/src/backend/cuda/kernels/window.cu > .../prev/window.cu`).
P=bench/tools/conv_direct/prev
for v in $V; do
  n=${v%%:*}; f=$(echo "${v#*:}" | tr , ' '); inc="-I $I"
  [ "${n#prev}" != "$n" ] && inc="-I $P -I $I"
  nvcc -arch=sm_90a -O3 -std=c++17 $inc $f bench/tools/conv_direct/harness.cu -o /tmp/cd_$n 2>&1 | grep -i error &
done; wait
for r in 1 2; do for v in $V; do n=${v%%:*}; echo "== $r $n"; /tmp/cd_$n | grep -v '^harness: 0'; done; done
