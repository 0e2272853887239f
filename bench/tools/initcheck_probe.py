# Does compute-sanitizer's initcheck see the writes of cuBLASLt's and cuDNN's kernels on
# this GPU? PyTorch runs the same library calls as kiln: an f16 and an f32 GEMM whose output
# an element-wise kernel then reads, and an f64 convolution with its backward. Run under
# `compute-sanitizer --tool initcheck`: findings here are the tool's or the library's,
# not kiln's. Usage: compute-sanitizer --tool initcheck python3 bench/tools/initcheck_probe.py CASE
import sys, torch
case = sys.argv[1]
torch.manual_seed(0)
dev = "cuda"
if case in ("gemm_f16", "gemm_f32", "gemm_bf16"):
    dt = {"gemm_f16": torch.half, "gemm_f32": torch.float, "gemm_bf16": torch.bfloat16}[case]
    a = torch.randn(256, 784, device=dev, dtype=dt)
    b = torch.randn(784, 128, device=dev, dtype=dt)
    c = a @ b          # the GEMM writes c
    d = c + 1          # an element-wise kernel reads it
elif case == "conv_f64":
    x = torch.randn(2, 3, 9, 9, device=dev, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, device=dev, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.conv2d(x, w, padding=1)
    y.sum().backward()
    d = y
torch.cuda.synchronize()
print(case, float(d.double().sum()))
