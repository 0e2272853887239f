"""PyTorch DDP twin of `kiln bench dist`: all-reduce bus bandwidth (1 MB - 1 GB, f32 sum) and
data-parallel training throughput of an MLP 784-4096-4096-4096-10 (f32 and bf16) and of
`kiln train --model cnn`'s network (f32, cudnn.benchmark on), 512 rows per GPU and step, SGD
with momentum. Same timing as kiln's: a loop of operations between two host
synchronisations after a warm-up, median of repeats; one JSON line per figure on rank 0.

    torchrun --standalone --nproc_per_node=N bench/torch_ddp.py [--quick] [--out FILE]
    (--cpu: gloo on CPU processes, to check the script where there is no GPU)
"""
import argparse, json, os, statistics, time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def loop_seconds(warmup, inner, reps, f):
    for _ in range(warmup):
        f()
    sync(DEV)
    times = []
    for _ in range(reps):
        dist.barrier()
        sync(DEV)
        t = time.perf_counter()
        for _ in range(inner):
            f()
        sync(DEV)
        times.append((time.perf_counter() - t) / inner)
    return statistics.median(times)


DEV = torch.device("cpu")  # set by main: the device loop_seconds synchronises


def all_reduce(world, quick, dev):
    sizes = [1 << 20, 16 << 20] if quick else [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
    out = []
    for nbytes in sizes:
        t = torch.randn(nbytes // 4, device=dev)
        inner = max(2, min(50, (256 << 20) // nbytes)) * (1 if quick else 2)
        s = loop_seconds(3, inner, 3 if quick else 7, lambda: dist.all_reduce(t))
        factor = 2 * (world - 1) / world if world > 1 else 1.0
        label = f"{nbytes >> 30} GB" if nbytes >= 1 << 30 else f"{nbytes >> 20} MB"
        out.append(dict(name=f"all_reduce {label}", value=factor * nbytes / s / 1e9,
                        unit="GB/s (bus)", ms=s * 1e3))
    return out


def mnist_cnn():
    """`kiln train --model cnn` (kiln_nn::conv::mnist_cnn with 128 hidden units)."""
    return nn.Sequential(
        nn.Unflatten(1, (1, 28, 28)),
        nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def train(world, rank, sizes, per_device, dtype, quick, dev):
    """`sizes`: an MLP's layer sizes, or "cnn"."""
    steps = 4 if quick else 30
    torch.manual_seed(1)
    if sizes == "cnn":
        model, features, classes, label = mnist_cnn(), 784, 10, "cnn mnist"
    else:
        layers = []
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i + 2 < len(sizes):
                layers.append(nn.ReLU())
        model, features, classes = nn.Sequential(*layers), sizes[0], sizes[-1]
        label = "mlp " + "-".join(map(str, sizes))
    model = model.to(dev, dtype)
    ids = [dev.index] if dev.type == "cuda" else None
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=25)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    batch = per_device * world
    rows = batch * steps
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(rows, features, device=dev, dtype=dtype, generator=g)
    y = torch.randint(0, classes, (rows,), device=dev, generator=g)

    def epoch(seed):
        perm = torch.randperm(rows, device=dev, generator=torch.Generator(device=dev).manual_seed(seed))
        for s in range(steps):
            idx = perm[s * batch + rank * per_device: s * batch + (rank + 1) * per_device]
            loss = F.cross_entropy(ddp(x[idx]).float(), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    epoch(2)  # warm-up
    sync(dev)
    dist.barrier()
    t = time.perf_counter()
    epoch(3)
    sync(dev)
    secs = time.perf_counter() - t
    name = f"train {label} {str(dtype).removeprefix('torch.').replace('float32', 'f32').replace('bfloat16', 'bf16')} x{per_device}/device"
    return dict(name=name, value=rows / secs, unit="samples/s", ms=secs * 1e3 / steps)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out")
    p.add_argument("--cpu", action="store_true")
    a = p.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    local = int(os.environ.get("LOCAL_RANK", 0))
    if a.cpu:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
        torch.backends.cudnn.benchmark = True
    global DEV
    DEV = dev
    world, rank = dist.get_world_size(), dist.get_rank()
    records = all_reduce(world, a.quick, dev)
    sizes = [784, 256, 256, 10] if a.quick else [784, 4096, 4096, 4096, 10]
    for dtype in (torch.float32, torch.bfloat16):
        records.append(train(world, rank, sizes, 512, dtype, a.quick, dev))
    records.append(train(world, rank, "cnn", 512, torch.float32, a.quick, dev))
    if rank == 0:
        lines = "".join(json.dumps(dict(framework="pytorch", world=world, **r)) + "\n" for r in records)
        print(lines, end="")
        if a.out:
            open(a.out, "w").write(lines)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
