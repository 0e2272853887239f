#!/usr/bin/env python3
"""PyTorch eager twin of `kiln train` (MLP 784-H-10 or, with --model cnn, its CNN; batch 256, SGD momentum 0.9, lr 0.05 with
a cosine schedule, inputs normalised by the training set's mean and std, 234 full batches per
epoch) for epoch times on the same data and device. With --kiln-checkpoint FILE it also loads a
kiln checkpoint with safetensors and reports its test accuracy (checkpoint compatibility).

    python3 bench/torch_train.py --data DIR --device cuda --epochs 10 [--hidden 128] [--model cnn] [--out m.json]
"""
import argparse, gzip, json, math, os, time

import numpy as np
import torch


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def load(dir_):
    def f(stem):
        for name in (stem + ".gz", stem):
            p = os.path.join(dir_, name)
            if os.path.exists(p):
                return p
        raise SystemExit(f"{dir_} has no {stem}")
    tx = read_idx(f("train-images-idx3-ubyte")).reshape(-1, 784).astype(np.float32) / 255.0
    ty = read_idx(f("train-labels-idx1-ubyte")).astype(np.int64)
    vx = read_idx(f("t10k-images-idx3-ubyte")).reshape(-1, 784).astype(np.float32) / 255.0
    vy = read_idx(f("t10k-labels-idx1-ubyte")).astype(np.int64)
    mean, std = float(tx.astype(np.float64).mean()), float(tx.astype(np.float64).std())
    return (tx - mean) / std, ty, (vx - mean) / std, vy


def model(hidden, kind="mlp"):
    if kind == "cnn":
        nn = torch.nn  # PyTorch's default initialisation, as `kiln train --model cnn` draws it
        return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(3136, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    m = torch.nn.Sequential(torch.nn.Linear(784, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    torch.nn.init.kaiming_uniform_(m[0].weight, nonlinearity="relu")
    torch.nn.init.zeros_(m[0].bias)
    torch.nn.init.xavier_uniform_(m[2].weight)
    torch.nn.init.zeros_(m[2].bias)
    return m


def accuracy(m, x, y):
    m.eval()
    with torch.no_grad():
        hits = sum((m(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum().item() for i in range(0, x.shape[0], 1000))
    m.train()
    return hits / x.shape[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kiln-checkpoint")
    p.add_argument("--out")
    a = p.parse_args()
    dev = torch.device(a.device)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(a.seed)
    tx, ty, vx, vy = load(a.data)
    tx, ty, vx, vy = (torch.from_numpy(v).to(dev) for v in (tx, ty, vx, vy))
    report = {"library": "torch", "version": torch.__version__, "device": str(dev),
              "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
              "threads": torch.get_num_threads(), "hidden": a.hidden, "model": a.model, "epochs": []}
    if a.kiln_checkpoint:
        from safetensors.torch import load_file
        state = load_file(a.kiln_checkpoint)
        m = model(a.hidden, a.model).to(dev)
        m.load_state_dict({k: v for k, v in state.items() if not k.startswith("optimizer.")})
        report["kiln_checkpoint_test_acc"] = accuracy(m, vx, vy)
        print(f"kiln checkpoint {a.kiln_checkpoint}: test accuracy in PyTorch {100 * report['kiln_checkpoint_test_acc']:.2f}%")
    m = model(a.hidden, a.model).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=a.lr, momentum=0.9)
    n, steps = tx.shape[0], tx.shape[0] // a.batch
    for epoch in range(a.epochs):
        for g in opt.param_groups:
            g["lr"] = 0.5 * a.lr * (1 + math.cos(math.pi * epoch / a.epochs))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        perm = torch.randperm(n, device=dev)
        xs, ys = tx[perm], ty[perm]
        loss_sum = torch.zeros((), device=dev)
        for s in range(steps):
            x, y = xs[s * a.batch:(s + 1) * a.batch], ys[s * a.batch:(s + 1) * a.batch]
            loss = torch.nn.functional.cross_entropy(m(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.detach()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        acc = accuracy(m, vx, vy)
        report["epochs"].append({"epoch": epoch + 1, "seconds": secs, "train_loss": loss_sum.item() / steps, "test_acc": acc})
        print(f"torch epoch {epoch + 1:>3}/{a.epochs}  {secs * 1e3:8.1f} ms  train loss {loss_sum.item() / steps:.4f}  test acc {100 * acc:.2f}%")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
