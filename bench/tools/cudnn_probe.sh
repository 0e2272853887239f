#!/usr/bin/env bash
# Which cuDNN plan kiln picks for the conv rows below PyTorch, and what each candidate costs
# as an isolated call (KILN_CUDNN_LOG=2), beside PyTorch's rate and kernels for the same rows.
#   (here) cargo build --workspace --release --bins; mkdir -p .kbin; xz -T2 -3 -c target/release/kiln > .kbin/kiln.xz
#   (device tool) carry [".kbin"], command: bash bench/tools/cudnn_probe.sh [CANDIDATE COUNTS, default "8 64"]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
mkdir -p .gpu/bin && xz -dc .kbin/kiln.xz > .gpu/bin/kiln && chmod +x .gpu/bin/kiln
export KILN_KERNEL_CACHE=/tmp/kiln-kernels
cudnn_lib=$(python3 -c 'import nvidia.cudnn as c, os; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=${cudnn_lib}:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
ROWS=${ROWS:-"tf32:b64-128x128-28-k3,b64-256x256-14-k3,b64-512x512-7-k3 bf16:b256-32x64-14-k5"}
for cand in ${1:-8 64}; do
  for spec in $ROWS; do
    p=${spec%%:*}; shapes=${spec#*:}
    KILN_BENCH_CONV=$shapes KILN_BENCH_CONV_PRECISIONS=$p KILN_CUDNN_CANDIDATES=$cand KILN_CUDNN_LOG=2 \
      .gpu/bin/kiln bench run --device cuda --suite conv --out "$OUT/kiln_${p}_c$cand.json" \
      > "$OUT/kiln_${p}_c$cand.log" 2>&1
    echo "== candidates $cand, $p"; grep -E "^conv/" "$OUT/kiln_${p}_c$cand.log"
  done
done
cat > /tmp/torch_rows.py <<'PY'
import torch, sys, statistics
from torch.profiler import profile, ProfilerActivity
torch.backends.cudnn.benchmark = True
for spec in sys.argv[1].split():
    p, shapes = spec.split(":")
    torch.backends.cudnn.allow_tf32 = p == "tf32"
    dt = torch.bfloat16 if p == "bf16" else torch.float32
    for name in shapes.split(","):
        b, rest = name.split("-", 1)
        ch, size, k = rest.split("-")
        n, (cin, cout), size, k = int(b[1:]), map(int, ch.split("x")), int(size), int(k[1:])
        x = torch.randn(n, cin, size, size, device="cuda").to(dt)
        w = (torch.randn(cout, cin, k, k, device="cuda") * 0.1).to(dt)
        bias = torch.randn(cout, device="cuda").to(dt)
        f = lambda: torch.nn.functional.conv2d(x, w, bias, padding=k // 2)
        with torch.no_grad():
            for _ in range(3): f()
            torch.cuda.synchronize()
            ts = []
            for _ in range(40):
                a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); f(); e.record(); e.synchronize(); ts.append(a.elapsed_time(e))
            ms = statistics.median(ts)
            flops = 2.0 * n * cout * size * size * cin * k * k
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                f(); torch.cuda.synchronize()
        kern = [(e.name, e.device_time) for e in prof.events() if e.device_time > 0]
        print(f"torch conv/{name}/{p}/fwd {ms:.4f} ms {flops / ms / 1e9:.1f} TFLOP/s")
        for kn, t in kern:
            print(f"    {t:8.1f} us  {kn[:150]}")
PY
python3 /tmp/torch_rows.py "$ROWS" 2>&1 | tee "$OUT/torch_rows.txt"
