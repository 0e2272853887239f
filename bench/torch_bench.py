#!/usr/bin/env python3
"""PyTorch twin of `kiln bench run`: the same workloads, names, byte and FLOP counts, timing
method (device events per repeat after warm-up, median; inputs rotated past the L2) and JSON
schema, so `kiln bench compare kiln.json torch.json` can put the two side by side.

    python3 bench/torch_bench.py --device cuda --out torch.json [--quick] [--suite gemm,softmax]
"""
import argparse, datetime, json, os, statistics, subprocess, time

import torch

SUITES = ["peak", "gemm", "elementwise", "activation", "reduce", "softmax", "transfer", "overhead", "alloc", "train", "conv", "cnn", "sparse"]
ROTATE_BYTES = 256 << 20


class Ctx:
    def __init__(self, device, quick):
        self.device, self.quick = device, quick
        self.cuda = device.type == "cuda"
        self.records, self.copy_gbps, self.gemm_peak = [], None, {}
        self.gen = torch.Generator(device="cpu").manual_seed(0)

    def randn(self, shape, dtype=torch.float32):
        return torch.randn(shape, generator=self.gen, dtype=torch.float32).to(dtype).to(self.device)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def median_ms(self, f):
        warmup, min_reps, budget = (1, 3, 0.1) if self.quick else (3, 10, 0.8)
        for _ in range(warmup):
            f()
        self.sync()
        times, start = [], time.perf_counter()
        while len(times) < min_reps or (time.perf_counter() - start < budget and len(times) < 200):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); f(); b.record(); b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t = time.perf_counter(); f(); times.append((time.perf_counter() - t) * 1e3)
        return statistics.median_low(sorted(times)) if len(times) % 2 == 0 else statistics.median(times)

    def median_wall_ms(self, f):
        reps = 3 if self.quick else 9
        f(); self.sync()
        times = []
        for _ in range(reps):
            t = time.perf_counter(); f(); self.sync(); times.append((time.perf_counter() - t) * 1e3)
        return sorted(times)[len(times) // 2]

    def push(self, suite, name, ms, unit, value, pct=None):
        self.records.append(dict(suite=suite, name=name, median_ms=ms, unit=unit, value=value, pct_peak=pct))

    def bandwidth(self, suite, name, ms, nbytes):
        gbps = nbytes / (ms * 1e-3) / 1e9
        self.push(suite, name, ms, "GB/s", gbps, 100 * gbps / self.copy_gbps if self.copy_gbps else None)

    def rotating(self, nbytes, make, f):
        copies = 1 if not self.cuda else max(1, min(64, -(-ROTATE_BYTES // max(nbytes, 1))))
        sets = [make() for _ in range(copies)]
        state = {"i": 0}

        def step():
            state["i"] = (state["i"] + 1) % len(sets)
            f(sets[state["i"]])
        return self.median_ms(step)


def sizes(c):
    if c.quick:
        return [1 << 10, 1 << 16]
    return [1 << 10, 1 << 16, 1 << 20, 1 << 24] + ([1 << 26] if c.cuda else [])


def peak(c):
    n = (1 << 22) if (not c.cuda or c.quick) else (1 << 26)
    x = c.randn(n)
    ms = c.median_ms(lambda: x.clone())
    c.copy_gbps = 2 * 4 * n / (ms * 1e-3) / 1e9
    c.push("peak", f"peak/copy/f32/{n}", ms, "GB/s", c.copy_gbps, 100.0)


def gemm(c):
    if c.quick:
        ns = [256, 512]
    else:
        ns = [64, 256, 512, 1024, 2048] if not c.cuda else [64, 256, 512, 1024, 2048, 4096, 8192]
    skinny = [(256, 784, 128)] if c.quick else [(256, 784, 128), (256, 784, 1024), (16384, 1024, 128)]
    dtypes = [("f32", torch.float32)] if not c.cuda else [
        ("f32", torch.float32), ("tf32", torch.float32), ("bf16", torch.bfloat16), ("f16", torch.float16)]
    for label, dt in dtypes:
        if c.cuda:
            torch.backends.cuda.matmul.allow_tf32 = label == "tf32"
        for n in ns:
            a, b, at = c.randn((n, n), dt), c.randn((n, n), dt), c.randn((n, n), dt).t()
            flops = 2.0 * n ** 3
            for variant, lhs in (("nn", a), ("tn", at)):
                ms = c.median_ms(lambda: lhs @ b)
                tf = flops / (ms * 1e-3) / 1e12
                c.gemm_peak[label] = max(c.gemm_peak.get(label, 0.0), tf)
                c.push("gemm", f"gemm/{label}/{n}/{variant}", ms, "TFLOP/s", tf)
        for m, k, n in skinny:
            a, at, b = c.randn((m, k), dt), c.randn((k, m), dt).t(), c.randn((k, n), dt)
            for variant, lhs in (("nn", a), ("tn", at)):
                ms = c.median_ms(lambda: lhs @ b)
                c.push("gemm", f"gemm/{label}/{m}x{k}x{n}/{variant}", ms, "TFLOP/s", 2.0 * m * k * n / (ms * 1e-3) / 1e12)
        n = 256 if c.quick else (4096 if c.cuda else 512)
        x, w = c.randn((n, n), dt), c.randn((n, n), dt) * (1.0 / n ** 0.5)

        def chain():
            y = x
            for _ in range(4):
                y = y @ w
        ms = c.median_ms(chain)
        c.push("gemm", f"gemm/{label}/{n}/chain4", ms, "TFLOP/s", 4 * 2.0 * n ** 3 / (ms * 1e-3) / 1e12)
    if c.cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
    for r in c.records:
        if r["suite"] == "gemm":
            r["pct_peak"] = 100 * r["value"] / c.gemm_peak[r["name"].split("/")[1]]


def elementwise(c):
    for n in sizes(c):
        for op in ("add", "mul"):
            fn = (lambda ab: ab[0] + ab[1]) if op == "add" else (lambda ab: ab[0] * ab[1])
            ms = c.rotating(8 * n, lambda: (c.randn(n), c.randn(n)), fn)
            c.bandwidth("elementwise", f"elementwise/{op}/f32/{n}", ms, 12 * n)
    # A transposed view made contiguous: read once, written once.
    for s in ([256] if c.quick else [256, 1024, 4096]):
        ms = c.rotating(4 * s * s, lambda: c.randn((s, s)), lambda x: x.t().contiguous())
        c.bandwidth("elementwise", f"elementwise/transpose_copy/f32/{s}x{s}", ms, 8 * s * s)


def activation(c):
    for n in sizes(c):
        fns = {"relu": torch.relu, "gelu": torch.nn.functional.gelu,
               "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
               "exp": torch.exp, "tanh": torch.tanh, "sigmoid": torch.sigmoid}
        for op, fn in fns.items():
            ms = c.rotating(4 * n, lambda: c.randn(n), fn)
            c.bandwidth("activation", f"activation/{op}/f32/{n}", ms, 8 * n)


def reduce(c):
    for n in sizes(c):
        for op, fn in (("sum", torch.sum), ("max", torch.max), ("argmax", torch.argmax)):
            ms = c.rotating(4 * n, lambda: c.randn(n), fn)
            c.bandwidth("reduce", f"reduce/{op}/f32/{n}", ms, 4 * n)


def softmax(c):
    if c.quick:
        shapes = [(256, 10), (512, 1024)]
    elif not c.cuda:
        shapes = [(256, 10), (1024, 1024), (4096, 1024)]
    else:
        shapes = [(256, 10), (4096, 1024), (32768, 4096), (8192, 32000)]
    for r, k in shapes:
        for name, fn in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
            ms = c.rotating(4 * r * k, lambda: c.randn((r, k)), lambda x: fn(x, -1))
            c.bandwidth("softmax", f"{name}/f32/{r}x{k}", ms, 8 * r * k)
        # A reduction: the input read once (the r outputs are not counted).
        ms = c.rotating(4 * r * k, lambda: c.randn((r, k)), lambda x: torch.logsumexp(x, 1))
        c.bandwidth("softmax", f"logsumexp/f32/{r}x{k}", ms, 4 * r * k)


def transfer(c):
    if not c.cuda:
        return
    for nbytes in ([256 << 10, 4 << 20] if c.quick else [256 << 10, 1 << 20, 4 << 20, 64 << 20, 256 << 20]):
        n = nbytes // 4
        label = size_label(nbytes)
        host = torch.randn(n, generator=c.gen)
        pinned = host.pin_memory()
        dev = host.to(c.device)
        pinned_out = torch.empty(n, pin_memory=True)
        for kind, h2d, d2h in (
            ("pageable", lambda: host.to(c.device), lambda: dev.to("cpu")),
            ("pinned", lambda: pinned.to(c.device, non_blocking=True), lambda: pinned_out.copy_(dev, non_blocking=True)),
        ):
            for direction, f in (("h2d", h2d), ("d2h", d2h)):
                ms = c.median_wall_ms(f)
                c.push("transfer", f"transfer/{direction}/{kind}/{label}", ms, "GB/s", nbytes / (ms * 1e-3) / 1e9)


def overhead(c):
    a, b, acc = c.randn(1024), c.randn(1024), c.randn(1024)
    reps = 1000 if c.quick else 10000
    for name, op in (("tiny_add", lambda: a + b), ("tiny_add_assign", lambda: acc.add_(b))):
        for _ in range(100):
            op()
        c.sync()
        per = []
        for _ in range(1 if c.quick else 5):
            t = time.perf_counter()
            for _ in range(reps):
                op()
            c.sync()
            per.append((time.perf_counter() - t) * 1e6 / reps)
        us = sorted(per)[len(per) // 2]
        c.push("overhead", f"overhead/{name}/f32/1024", us * 1e-3, "us", us)
        host = []
        for _ in range(5 if c.quick else 50):
            c.sync()
            t = time.perf_counter()
            for _ in range(200):
                op()
            host.append((time.perf_counter() - t) * 1e6 / 200)
        c.sync()
        us = sorted(host)[len(host) // 2]
        c.push("overhead", f"overhead/{name}_host/f32/1024", us * 1e-3, "us", us)
    x = c.randn((64, 64, 64))
    views = {
        "transpose": lambda: x.transpose(0, 2),
        "narrow": lambda: x.narrow(1, 3, 20),
        "broadcast": lambda: x.unsqueeze(0).expand(4, 64, 64, 64),
        "is_contiguous": lambda: x.is_contiguous(),
    }
    for name, f in views.items():
        iters, samples = 100_000, []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(iters):
                f()
            samples.append((time.perf_counter() - t) * 1e9 / iters)
        ns = sorted(samples)[3]
        c.push("overhead", f"overhead/view/{name}", ns * 1e-6, "ns", ns)


def size_label(nbytes):
    return f"{nbytes >> 20}MB" if nbytes >= 1 << 20 else f"{nbytes >> 10}KB"


def alloc(c):
    for nbytes in ([4 << 10, 1 << 20] if c.quick else [4 << 10, 1 << 20, 64 << 20]):
        n = nbytes // 4
        reps = 100 if c.quick else max(20, min(2000, (256 << 20) // nbytes))
        per = []
        for _ in range(2 if c.quick else 7):
            t = time.perf_counter()
            for _ in range(reps):
                del_me = torch.zeros(n, device=c.device)
                del del_me
            c.sync()
            per.append((time.perf_counter() - t) * 1e6 / reps)
        us = sorted(per)[len(per) // 2]
        c.push("alloc", f"alloc/zeros/{size_label(nbytes)}", us * 1e-3, "us", us)
    if c.cuda:
        shapes = [256 * 784, 256 * 128, 256 * 10, 784 * 128, 128, 10]
        before = torch.cuda.memory_stats(c.device)
        for _ in range(100):
            live = [torch.zeros(n, device=c.device) for n in shapes]
            del live
        c.sync()
        after = torch.cuda.memory_stats(c.device)
        requests = after["allocation.all.allocated"] - before["allocation.all.allocated"]
        fresh = after["segment.all.allocated"] - before["segment.all.allocated"]
        c.push("alloc", "alloc/reuse_rate", 0.0, "%", 100.0 * (1.0 - fresh / max(requests, 1)))


def train(c):
    """Epoch time of the MLPs 784-128-10 and 784-1024-10 (SGD momentum 0.9, batch 256) on
    random rows and labels, as kiln's `train` suite: permuted once per epoch on the GPU,
    gathered per batch on the CPU; loss and hit sums stay on the device until the end."""
    batch, steps = 256, (8 if c.quick else 234)
    rows = batch * steps
    x = c.randn((rows, 784))
    y = torch.randint(0, 10, (rows,), generator=c.gen).to(c.device)
    # KILN_BENCH_TRAIN_HIDDEN=1024 runs one model (for profiling), as kiln's train suite.
    hiddens = [int(h) for h in os.environ.get("KILN_BENCH_TRAIN_HIDDEN", "128,1024").split(",")]
    for hidden in hiddens:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(784, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)).to(c.device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        times = []
        for epoch in range(2 if c.quick else 4):
            t = time.perf_counter()
            perm = torch.randperm(rows, generator=c.gen).to(c.device)
            xs, ys = (x[perm], y[perm]) if c.cuda else (None, None)
            loss_sum = torch.zeros((), device=c.device)
            hit_sum = torch.zeros((), device=c.device)
            for b in range(steps):
                if c.cuda:
                    xb, yb = xs[b * batch:(b + 1) * batch], ys[b * batch:(b + 1) * batch]
                else:
                    ids = perm[b * batch:(b + 1) * batch]
                    xb, yb = x[ids], y[ids]
                logits = model(xb)
                loss = torch.nn.functional.cross_entropy(logits, yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                loss_sum += loss.detach()
                hit_sum += (logits.argmax(1) == yb).sum()
            loss_sum.item(), hit_sum.item()
            if epoch > 0:
                times.append((time.perf_counter() - t) * 1e3)
        ms = sorted(times)[len(times) // 2]
        c.push("train", f"train/mlp784-{hidden}-10/b{batch}/epoch", ms, "ms", ms)
        if c.cuda:
            ms = train_graph(c, x, y, hidden, batch, steps)
            c.push("train", f"train/mlp784-{hidden}-10/b{batch}/epoch-graph", ms, "ms", ms)


def train_graph(c, x, y, hidden, batch, steps):
    """The same epoch with the whole step (forward, loss, backward, fused SGD, running sums)
    captured in one CUDA graph and replayed per batch; batches are gathered into static
    inputs by index (as kiln's recorded step does), following PyTorch's whole-network
    capture recipe (warm-up on a side stream, `torch.cuda.graph`, `SGD(fused=True)`)."""
    rows = batch * steps
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)).to(c.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=True)
    ids = torch.zeros(batch, dtype=torch.long, device=c.device)
    loss_sum = torch.zeros((), device=c.device)
    hit_sum = torch.zeros((), device=c.device)

    def step():
        xb, yb = x[ids], y[ids]
        logits = model(xb)
        loss = torch.nn.functional.cross_entropy(logits, yb)
        loss.backward()
        opt.step()
        loss_sum.add_(loss.detach())
        hit_sum.add_((logits.argmax(1) == yb).sum())

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    times = []
    for epoch in range(2 if c.quick else 4):
        t = time.perf_counter()
        perm = torch.randperm(rows, generator=c.gen).to(c.device)
        loss_sum.zero_()
        hit_sum.zero_()
        for b in range(steps):
            ids.copy_(perm[b * batch:(b + 1) * batch])
            graph.replay()
        loss_sum.item(), hit_sum.item()
        if epoch > 0:
            times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


CONV_SHAPES = [
    ("b32-32x64-28-k3", 32, 32, 28, 64, 3, 1),
    ("b1-3x64-224-k3", 1, 3, 224, 64, 3, 1),
    ("b256-1x32-28-k5", 256, 1, 28, 32, 5, 2),
    ("b256-32x64-14-k5", 256, 32, 14, 64, 5, 2),
    ("b64-64x64-56-k3", 64, 64, 56, 64, 3, 1),
    ("b64-128x128-28-k3", 64, 128, 28, 128, 3, 1),
    ("b64-256x256-14-k3", 64, 256, 14, 256, 3, 1),
    ("b64-512x512-7-k3", 64, 512, 7, 512, 3, 1),
]


def conv(c):
    """kiln's `conv` suite: forward and forward+backward (input, weight and bias gradients)
    with cudnn.benchmark on; "f32" with TF32 off, "tf32" with PyTorch's default (TF32 on for
    convolutions), "bf16"."""
    torch.backends.cudnn.benchmark = True
    precisions = [("f32", torch.float32)] if not c.cuda else [("f32", torch.float32), ("tf32", torch.float32), ("bf16", torch.bfloat16)]
    shapes = CONV_SHAPES[:4] if (c.quick or not c.cuda) else CONV_SHAPES
    for label, dtype in precisions:
        torch.backends.cudnn.allow_tf32 = label == "tf32"
        for name, n, cin, size, cout, k, pad in shapes:
            x = c.randn((n, cin, size, size), dtype)
            w = (c.randn((cout, cin, k, k), dtype) * 0.1)
            b = c.randn((cout,), dtype)
            out = size + 2 * pad - k + 1
            flops = 2.0 * n * cout * out * out * cin * k * k
            with torch.no_grad():
                ms = c.median_ms(lambda: torch.nn.functional.conv2d(x, w, b, padding=pad))
            row = f"conv/{name}/{label}"
            c.push("conv", f"{row}/fwd", ms, "TFLOP/s", flops / ms / 1e9)
            if c.cuda:
                # The host's share of a forward call, as kiln's row: bursts of 10 after a sync.
                host = []
                with torch.no_grad():
                    for _ in range(5 if c.quick else 30):
                        c.sync()
                        t = time.perf_counter()
                        for _ in range(10):
                            torch.nn.functional.conv2d(x, w, b, padding=pad)
                        host.append((time.perf_counter() - t) * 1e6 / 10)
                c.sync()
                us = sorted(host)[len(host) // 2]
                c.push("conv", f"{row}/fwd_host", us * 1e-3, "us", us)
            xv, wv, bv = (t.clone().requires_grad_() for t in (x, w, b))
            g = c.randn((n, cout, out, out), dtype)

            def fb():
                torch.nn.functional.conv2d(xv, wv, bv, padding=pad).backward(g)
                xv.grad = wv.grad = bv.grad = None
            ms = c.median_ms(fb)
            c.push("conv", f"{row}/fwdbwd", ms, "TFLOP/s", 3 * flops / ms / 1e9)
    torch.backends.cudnn.allow_tf32 = True


def cnn_model(device):
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)


def cnn(c):
    """kiln's `cnn` suite: epochs of the CNN (SGD momentum 0.9, batch 256) on random data,
    eagerly and (CUDA) with the step in a CUDA graph; the CPU runs 16 steps and scales to 234.
    cudnn.benchmark on, default precision (TF32 convolutions)."""
    torch.backends.cudnn.benchmark = True
    full = 234
    batch, steps = (256, 4) if c.quick else ((256, 16) if not c.cuda else (256, full))
    rows = batch * steps
    x = c.randn((rows, 784))
    y = torch.randint(0, 10, (rows,), generator=c.gen).to(c.device)
    model = cnn_model(c.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    times = []
    for epoch in range(2 if c.quick else 4):
        t = time.perf_counter()
        perm = torch.randperm(rows, generator=c.gen).to(c.device)
        loss_sum = torch.zeros((), device=c.device)
        for b in range(steps):
            ids = perm[b * batch:(b + 1) * batch]
            xb, yb = x[ids], y[ids]
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.detach()
        loss_sum.item()
        if epoch > 0:
            times.append((time.perf_counter() - t) * 1e3 * full / steps)
    ms = sorted(times)[len(times) // 2]
    c.push("cnn", f"train/cnn/b{batch}/epoch", ms, "ms", ms)
    if not c.cuda:
        return
    model = cnn_model(c.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=True)
    ids = torch.zeros(batch, dtype=torch.long, device=c.device)
    loss_sum = torch.zeros((), device=c.device)

    def step():
        loss = torch.nn.functional.cross_entropy(model(x[ids]), y[ids])
        loss.backward()
        opt.step()
        loss_sum.add_(loss.detach())

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    times = []
    for epoch in range(2 if c.quick else 4):
        t = time.perf_counter()
        perm = torch.randperm(rows, generator=c.gen).to(c.device)
        loss_sum.zero_()
        for b in range(steps):
            ids.copy_(perm[b * batch:(b + 1) * batch])
            graph.replay()
        loss_sum.item()
        if epoch > 0:
            times.append((time.perf_counter() - t) * 1e3)
    ms = sorted(times)[len(times) // 2]
    c.push("cnn", f"train/cnn/b{batch}/epoch-graph", ms, "ms", ms)


def mix(x):
    """SplitMix64's finaliser on a uint64 array (crates/kiln-bench/src/sparse.rs: `mix`)."""
    import numpy as np
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def bench_matrix(kind, n):
    """(row_ptr, col_idx) as int64 numpy arrays, entry for entry those of kiln's `bench_matrix`."""
    import numpy as np
    i = np.arange(n, dtype=np.uint64)
    if kind == "cycle":
        deg = np.ones(n, dtype=np.int64)
    elif kind == "random16":
        deg = np.full(n, 16, dtype=np.int64)
    else:
        u = ((mix(np.uint64(0xD0) ^ i) >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * (1.0 / (1 << 53))
        deg = np.minimum(np.floor(4.0 * u ** (-2.0 / 3.0)).astype(np.int64), n // 8)
    row_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(deg, out=row_ptr[1:])
    rows = np.repeat(np.arange(n, dtype=np.int64), deg)
    j = np.arange(row_ptr[-1], dtype=np.int64) - np.repeat(row_ptr[:-1], deg)
    if kind == "cycle":
        cols = (rows + 1) % n
    else:
        key = (rows.astype(np.uint64) << np.uint64(24)) | j.astype(np.uint64)
        cols = (mix(np.uint64(0xC0) ^ key) % np.uint64(n)).astype(np.int64)
    order = np.lexsort((cols, rows))
    return row_ptr, cols[order]


def sparse(c):
    """SpMV and SpMM (64 columns) of f32 CSR matrices with int32 indices (torch.sparse_csr)."""
    n = (1 << 16) if c.quick else (1 << 20)
    ncols = 64
    for kind in ["cycle", "random16", "powerlaw"]:
        rp, ci = bench_matrix(kind, n)
        nnz = len(ci)
        a = torch.sparse_csr_tensor(torch.from_numpy(rp).to(torch.int32), torch.from_numpy(ci).to(torch.int32),
                                    c.randn(nnz).cpu(), size=(n, n)).to(c.device)
        matrix_bytes = 4 * (n + 1 + nnz) + 4 * nnz
        x = c.randn(n)
        ms = c.median_ms(lambda: torch.mv(a, x))
        c.bandwidth("sparse", f"sparse/{kind}/spmv", ms, matrix_bytes + 8 * n)
        xm = c.randn((n, ncols))
        ms = c.median_ms(lambda: torch.mm(a, xm))
        c.bandwidth("sparse", f"sparse/{kind}/spmm{ncols}", ms, matrix_bytes + 8 * n * ncols)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--suite", default="", help="comma-separated suites (default: all)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out")
    args = p.parse_args()
    device = torch.device(args.device)
    c = Ctx(device, args.quick)
    wanted = [s for s in args.suite.split(",") if s]
    for s in SUITES:
        if not wanted or s in wanted or s == "peak":
            globals()[s](c)
    name = torch.cuda.get_device_name(device) if c.cuda else f"{torch.__config__.parallel_info().splitlines()[0]} cpu"
    commit = os.environ.get("KILN_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
    report = {
        "schema": 1, "library": "torch", "version": torch.__version__, "device": str(device), "device_name": name,
        "commit": commit, "date": os.environ.get("KILN_DATE") or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "settings": {"quick": args.quick, "cpu_threads": torch.get_num_threads(), "tf32_default": False},
        "peaks": {"copy_gbps": c.copy_gbps, "gemm_tflops": c.gemm_peak},
        "results": c.records,
    }
    for r in c.records:
        print(f"{r['name']:<40} {r['median_ms']:>12.4f} {r['value']:>8.2f} {r['unit']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
