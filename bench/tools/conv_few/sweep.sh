# Device machine: the few-output-channel harness built with FEW_BATCH (staging loads in flight)
# and FEW_MINB (blocks an SM, which caps registers) variants; the best shapes of each.
B="-arch=sm_90a -O3 -std=c++17 -I crates/kiln/src/backend/cuda/kernels bench/tools/conv_few/harness.cu"
V="b8m1:-DFEW_BATCH=8,-DFEW_MINB=1 b4m1:-DFEW_BATCH=4,-DFEW_MINB=1 b8m3:-DFEW_BATCH=8,-DFEW_MINB=3 b4m3:-DFEW_BATCH=4,-DFEW_MINB=3 b8m2:-DFEW_BATCH=8,-DFEW_MINB=2"
for v in $V; do n=${v%%:*}; f=$(echo ${v#*:} | tr , ' '); (nvcc $B $f -Xptxas -v -o /tmp/few_$n > $OUT/nvcc_$n.log 2>&1; echo "$n nvcc $?" >> $OUT/nvcc.rc) & done; wait; cat $OUT/nvcc.rc
for v in $V; do n=${v%%:*}; grep -A2 "few.*5ELi1E\|Li5ELi1E" $OUT/nvcc_$n.log | grep -E "registers|spill" | head -4 | sed "s/^/$n /"; done
for v in $V; do n=${v%%:*}; ONLY=${ONLY:-4,4} /tmp/few_$n > $OUT/h_$n.log 2>&1; echo "== $n"; sort -t: -k2 $OUT/h_$n.log | head -0; grep -E "f32|bf16" $OUT/h_$n.log | cut -c1-112; done
