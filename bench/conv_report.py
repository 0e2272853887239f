#!/usr/bin/env python3
"""Markdown tables of the convolutional-networks results in a folder written by
`bench/gpu_conv.sh` (kiln_conv.json, torch_conv.json, cpu2.json, kiln_cnn_*.json,
torch_cnn_cuda.json):

    python3 bench/conv_report.py bench/results/DATE-h100-conv > bench/results/DATE-h100-conv/README.md
"""
import json, os, sys

d = sys.argv[1]
load = lambda f: json.load(open(os.path.join(d, f))) if os.path.exists(os.path.join(d, f)) else None


def rows(a, b):
    bv = {r["name"]: r for r in b["results"]}
    for r in a["results"]:
        if r["name"] in bv and r["suite"] in ("conv", "cnn"):
            yield r, bv[r["name"]]


def table(a, b, title, note):
    print(f"## {title}\n\n{note}\n")
    print("| workload | kiln | PyTorch | kiln / PyTorch |\n| --- | ---: | ---: | ---: |")
    for k, t in rows(a, b):
        if k["unit"] == "ms":
            ratio = t["value"] / k["value"]
            print(f"| {k['name']} | {k['value']:.1f} ms | {t['value']:.1f} ms | {ratio:.2f}x |")
        elif k["unit"] == "us":
            ratio = t["value"] / k["value"]
            print(f"| {k['name']} (host) | {k['value']:.1f} us | {t['value']:.1f} us | {ratio:.2f}x |")
        elif k["unit"] == "TFLOP/s":
            ratio = k["value"] / t["value"]
            print(f"| {k['name']} | {k['value']:.2f} TFLOP/s | {t['value']:.2f} TFLOP/s | {ratio:.2f}x |")
    print()


k, t = load("kiln_conv.json"), load("torch_conv.json")
if k and t:
    table(k, t, f"Convolutions and CNN epochs on {k.get('device_name')} (commit {k.get('commit')})",
          "Median of device-event timings after warm-up, random data. Precision labels: `f32` = full f32 "
          "(kiln: FMA math; PyTorch: `cudnn.allow_tf32 = False`), `tf32` = TF32 tensor cores (kiln: "
          "`set_tf32(true)`; PyTorch: its default), `bf16`. PyTorch with `cudnn.benchmark = True`. "
          "fwdbwd = forward + input, weight and bias gradients (3x the forward FLOPs). CNN epochs: 234 "
          "steps of batch 256 on random data, TF32 on in both. Ratios > 1 favour kiln.")
cpu = load("cpu2.json")
if cpu:
    table(cpu["kiln"], cpu["torch"], "The same on two CPU cores of the GPU host",
          "`taskset -c 0,1`, `RAYON_NUM_THREADS=2` / `OMP_NUM_THREADS=2`; f32. The CPU CNN epoch is 16 "
          "steps scaled to 234.")
runs = [(n, load(f)) for n, f in [("kiln CUDA, graph, f32", "kiln_cnn_cuda.json"),
                                   ("kiln CPU", "kiln_cnn_cpu.json")]]
more = load("kiln_cnn_cuda_more.json") or {}
runs += [(f"kiln CUDA{k.replace('-', ', ')}", v) for k, v in more.items()]
torch = load("torch_cnn_cuda.json")
print("## `kiln train --model cnn` on Fashion-MNIST (10 epochs, seed 0)\n")
print("| run | epoch 1 | median epoch | test accuracy per epoch (%) |\n| --- | ---: | ---: | --- |")
for name, m in runs:
    if not m:
        continue
    eps = m["epochs"]
    secs = sorted(e["seconds"] for e in eps[1:])
    print(f"| {name} | {eps[0]['seconds'] * 1e3:.0f} ms | {secs[len(secs) // 2] * 1e3:.0f} ms | "
          + " ".join(f"{100 * e['test_acc']:.2f}" for e in eps) + " |")
if torch:
    eps = torch["epochs"]
    secs = sorted(e["seconds"] for e in eps[1:])
    print(f"| PyTorch CUDA eager (TF32 convs) | {eps[0]['seconds'] * 1e3:.0f} ms | {secs[len(secs) // 2] * 1e3:.0f} ms | "
          + " ".join(f"{100 * e['test_acc']:.2f}" for e in eps) + " |")
    if "kiln_checkpoint_test_acc" in torch:
        print(f"\nThe kiln CUDA checkpoint of epoch 10, loaded into the same `torch.nn.Sequential` with "
              f"safetensors: test accuracy {100 * torch['kiln_checkpoint_test_acc']:.2f}% in PyTorch.")
