K=crates/kiln/src/backend/cuda/kernels
F="-arch=sm_90a -O3 -std=c++17 -lineinfo -I $K bench/tools/conv_wgmma/dropped/harness_bulk_weights.cu"
for b in 0 1; do nvcc $F -DWG_BULK=$b -o /tmp/b$b 2>/dev/null & done
wait
for r in 1 2; do for b in 0 1; do echo "=== WG_BULK=$b round $r"; /tmp/b$b 12 2 | grep -v "^$" | grep -E "wg flat|failing|from idle|fused"; done; done
echo "=== all problems, bulk"; /tmp/b1 12 4 | grep -E "wg flat|failing|mismatch|differing"
echo "=== memcheck"; for i in 2 3; do timeout 120 compute-sanitizer --tool memcheck /tmp/b1 12 4 "" $i 2>&1 | grep -E "ERROR SUMMARY|failing|Invalid" | head -4; done
