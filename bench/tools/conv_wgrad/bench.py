# PyTorch's weight gradient (and weight + bias) of one convolution, cuDNN benchmark mode and
# TF32 on, timed back to back with CUDA events: median of 7 runs of 50 calls. DTYPE=bfloat16
# or float16 for 16-bit tensors (default float32).
#   python3 bench/tools/conv_wgrad/bench.py N C K H W R S PAD
import os, sys, torch
N, C, K, H, W, R, S, P = map(int, sys.argv[1:9])
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = True
dt = getattr(torch, os.environ.get("DTYPE", "float32"))
x = (torch.rand(N, C, H, W, device="cuda") * 2 - 1).to(dt)
w = (torch.rand(K, C, R, S, device="cuda") * 2 - 1).to(dt)
dy = (torch.rand(N, K, H + 2 * P - R + 1, W + 2 * P - S + 1, device="cuda") * 2 - 1).to(dt)
def time(mask):
    f = lambda: torch.ops.aten.convolution_backward(dy, x, w, [K], [1, 1], [P, P], [1, 1], False, [0, 0], 1, mask)
    for _ in range(10): f()
    ms = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(50): f()
        b.record(); b.synchronize(); ms.append(a.elapsed_time(b) * 1000 / 50)
    return sorted(ms)[3]
print(f"PyTorch {dt} b{N} {C}->{K} {H}x{W} k{R}x{S}: weight {time([False, True, False]):.1f} us, weight+bias {time([False, True, True]):.1f} us, all three {time([True, True, True]):.1f} us")
