#!/usr/bin/env bash
# Device-machine call: whether a run under a CUDA tool (ncu) leaves kiln's saved choices
# alone, on one problem (b256 32→64 14² 5×5, TF32). The choices must come from plain runs
# only: an ncu run on an empty cache saves nothing, a plain run then measures and saves, a
# second ncu run reads those and adds none. The kiln binary travels alone:
#   (here) cargo build --release -p kiln-cli; mkdir -p .kbin; xz -T2 -3 -c target/release/kiln > .kbin/kiln.xz
#   (device tool) carry [".kbin"], command: bash bench/tools/saved_choices_probe.sh
set -u
mkdir -p /tmp/kb && xz -dc .kbin/kiln.xz > /tmp/kb/kiln && chmod +x /tmp/kb/kiln
libdir() { python3 -c "import nvidia.$1 as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null; }
export LD_LIBRARY_PATH=$(libdir cudnn):/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KILN_KERNEL_CACHE=/tmp/kiln-probe; rm -rf "$KILN_KERNEL_CACHE"
export KILN_BENCH_CONV=b256-32x64-14-k5 KILN_BENCH_CONV_PRECISIONS=tf32
row() { python3 -c "import json,sys; d={r['name']:r for r in json.load(open(sys.argv[1]))['results']}; print(sys.argv[2], ' '.join(f\"{n.split('/')[-1]} {d[n]['median_ms']:.4f} ms\" for n in d))" "$@"; }
under_ncu() { timeout 200 ncu --metrics gpu__time_duration.sum --csv /tmp/kb/kiln bench run --quick --device cuda --suite conv --out /tmp/p$1.json > /tmp/ncu$1.csv 2>&1; echo "ncu run $1 exit $? ($(grep -c '^"' /tmp/ncu$1.csv) csv lines)"; }
saved() { cat "$KILN_KERNEL_CACHE"/*.txt 2>/dev/null | wc -l; }
# 1: under ncu on an empty cache: it measures, and must save nothing.
under_ncu 1; echo "saved-choice lines after the ncu run on an empty cache: $(saved)"
# 2: a plain run measures afresh and saves.
/tmp/kb/kiln bench run --device cuda --suite conv --out /tmp/p2.json > /dev/null 2>&1; row /tmp/p2.json "plain run:"
echo "saved-choice lines after the plain run: $(saved)"; cat "$KILN_KERNEL_CACHE"/*.txt | md5sum > /tmp/before.md5
# 3: under ncu again: it reads the plain run's choices and adds none.
under_ncu 3
cat "$KILN_KERNEL_CACHE"/*.txt | md5sum | diff -q - /tmp/before.md5 > /dev/null && echo "saved choices unchanged by the second ncu run" || echo "saved choices CHANGED by the second ncu run"
grep -E "conv_wgrad_mma|wgrad_alg0" /tmp/ncu3.csv | awk -F'","' '{print $5}' | sort | uniq -c | head -4
# 4: a plain run after both.
/tmp/kb/kiln bench run --device cuda --suite conv --out /tmp/p4.json > /dev/null 2>&1; row /tmp/p4.json "plain run after:"
