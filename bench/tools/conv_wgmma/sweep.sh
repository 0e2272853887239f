B="-arch=sm_90a -O3 -std=c++17 -I crates/kiln/src/backend/cuda/kernels bench/tools/conv_wgmma/harness.cu"
V="s3a1b4:-DWG_STAGES=3,-DWG_AHEAD=1,-DWG_BATCH=4 s2a1b4:-DWG_STAGES=2,-DWG_AHEAD=1,-DWG_BATCH=4 s4a1b4:-DWG_STAGES=4,-DWG_AHEAD=1,-DWG_BATCH=4 s4a2b4:-DWG_STAGES=4,-DWG_AHEAD=2,-DWG_BATCH=4 s3a1b2:-DWG_STAGES=3,-DWG_AHEAD=1,-DWG_BATCH=2 s3a1b8:-DWG_STAGES=3,-DWG_AHEAD=1,-DWG_BATCH=8 s3a2b4:-DWG_STAGES=3,-DWG_AHEAD=2,-DWG_BATCH=4"
for v in $V; do n=${v%%:*}; f=$(echo ${v#*:} | tr , ' '); (nvcc $B $f -o /tmp/wg_$n > $OUT/nvcc_$n.log 2>&1; echo "$n nvcc $?" >> $OUT/nvcc.rc) & done; wait; cat $OUT/nvcc.rc
for v in $V; do n=${v%%:*}; for w in 12 8; do for pick in 0 4; do echo "== $n warps $w problem $pick"; timeout 60 /tmp/wg_$n $w 5 tf32 $pick 2>&1 | grep -vE "^harness" | tail -3; done; done; done > $OUT/sweep.log
cat $OUT/sweep.log | cut -c1-160
