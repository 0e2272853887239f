#!/usr/bin/env python3
"""Writes docs/benchmarks.md from a GPU results folder (kiln_bench.json, torch_bench.json,
kiln_train_cuda.json, torch_train_cuda.json, gemm.png, bandwidth.png, curves_cuda.png) and a
CPU results folder (the same with _cpu names, from bench/cpu_run.sh), and optionally a
newer CPU training folder (kiln_train_cpu.json, torch_train_cpu.json, curves_cpu.png) when only
training was rerun.

    python3 bench/make_report.py bench/results/2026-11-22-h100 bench/results/2026-11-22-cpu > docs/benchmarks.md
"""
import json, os, sys

gpu, cpu = sys.argv[1], sys.argv[2]
cpu_train = sys.argv[3] if len(sys.argv) > 3 else cpu


def load(d, f):
    return json.load(open(os.path.join(d, f)))


def table(k, t):
    tm = {r["name"]: r for r in t["results"]}
    rows, ratios = [], []
    for r in k["results"]:
        o = tm.get(r["name"])
        if not o:
            continue
        hib = r["unit"] not in ("us", "ns", "ms")
        ratio = r["value"] / o["value"] if hib else o["value"] / r["value"]
        ratios.append((ratio, r["name"]))
        pct = f"{r['pct_peak']:.0f}%" if r.get("pct_peak") else ""
        rows.append(f"| {r['name']} | {r['value']:.2f} {r['unit']} | {o['value']:.2f} {o['unit']} | {ratio:.2f} | {pct} |")
    kiln_only = [r for r in k["results"] if r["name"] not in tm]
    torch_only = [r for r in t["results"] if r["name"] not in {x["name"] for x in k["results"]}]
    out = ["| workload | kiln | PyTorch | ratio | kiln % peak |", "|---|---|---|---|---|"] + rows
    worst = ", ".join(f"{n} {r:.2f}" for r, n in sorted(ratios)[:5])
    out.append(f"\nWorst five ratios: {worst}.")
    if kiln_only:
        out += ["", "Measured by kiln only:", "", "| workload | kiln |", "|---|---|"]
        out += [f"| {r['name']} | {r['value']:.2f} {r['unit']} |" for r in kiln_only]
    if torch_only:
        out += ["", "Measured by PyTorch only (kiln has no pinned host tensors yet; its transfers above are "
                "from and to ordinary host memory):", "", "| workload | PyTorch |", "|---|---|"]
        out += [f"| {r['name']} | {r['value']:.2f} {r['unit']} |" for r in torch_only]
    return "\n".join(out)


def training(kt, tt):
    out = ["| epoch | kiln ms | PyTorch eager ms | kiln test acc | PyTorch test acc |", "|---|---|---|---|---|"]
    for a, b in zip(kt["epochs"], tt["epochs"]):
        out.append(f"| {a['epoch']} | {a['seconds']*1e3:.1f} | {b['seconds']*1e3:.1f} | {100*a['test_acc']:.2f}% | {100*b['test_acc']:.2f}% |")
    med = lambda e: sorted(x["seconds"] * 1e3 for x in e[1:])[len(e[1:]) // 2]
    out.append(f"\nMedian of epochs 2–10: kiln {med(kt['epochs']):.1f} ms, PyTorch {med(tt['epochs']):.1f} ms. "
               f"The kiln checkpoint of epoch 10 scores {100*tt.get('kiln_checkpoint_test_acc', float('nan')):.2f}% in PyTorch.")
    return "\n".join(out)


kg, tg = load(gpu, "kiln_bench.json"), load(gpu, "torch_bench.json")
kc, tc = load(cpu, "kiln_bench_cpu.json"), load(cpu, "torch_bench_cpu.json")
trg, ttg = load(gpu, "kiln_train_cuda.json"), load(gpu, "torch_train_cuda.json")
trc, ttc = load(cpu_train, "kiln_train_cpu.json"), load(cpu_train, "torch_train_cpu.json")
rg, rc, rct = (os.path.relpath(d, "docs") for d in (gpu, cpu, cpu_train))
agree = max(abs(a["test_acc"] - c["test_acc"]) for a, c in zip(trg["epochs"], trc["epochs"])) * 100
print(f"""# Benchmarks

Every figure is kiln beside PyTorch on the same device in the same run: `kiln bench run` and
`bench/torch_bench.py` time the same workloads (on CUDA: device events per repeat after
warm-up, medians, random data, inputs rotated among buffers larger than the L2; on the CPU:
wall clock). The ratio is kiln's advantage: value/value for rates, inverted for times (above
1: kiln ahead). "% peak" is of the device copy bandwidth (bytes read + written) or of the best
GEMM rate of that precision, both measured in the same run.

## {kg['device_name']} ({kg['date'][:10]}, commit {kg['commit']}, PyTorch {tg['version']})

Reproduce: here `../shared/tools/gpu-bundle --bins --data /usr/share/datasets/fashion-mnist`,
`git rev-parse --short HEAD > .gpucarry/COMMIT` and `tar -cf - .gpu | xz > .gpucarry/gpu.tar.xz`;
on the GPU machine (device tool, carry `.gpucarry`) `bash bench/gpu_run.sh all` (tests,
`kiln bench run --device cuda` beside `python3 bench/torch_bench.py`, `kiln bench compare`,
`kiln train --device cuda` beside `bench/torch_train.py`); then
`kiln bench compare kiln_bench.json torch_bench.json --plots DIR` for the charts and
`python3 bench/make_report.py GPU_DIR CPU_DIR [CPU_TRAIN_DIR] > docs/benchmarks.md`.

{table(kg, tg)}

![GEMM]({rg}/gemm.png)
![bandwidth]({rg}/bandwidth.png)

### Training on the GPU: MLP 784-128-10, batch 256, 234 steps per epoch, SGD momentum 0.9, lr 0.05 cosine

{training(trg, ttg)}

Curves: [CUDA]({rg}/curves_cuda.png). The first epoch includes loading kernels (and, on a fresh
machine, compiling them).

## {kc['device_name']}, the CI-sized machine ({kc['date'][:10]}, commit {kc['commit']}, PyTorch {tc['version']} CPU)

Reproduce: `bash bench/cpu_run.sh OUTDIR PYTHON` (PYTHON: an interpreter with torch, numpy and
safetensors; the PyPI wheel runs without a GPU). This machine is shared and noisy: repeated
runs move small-size figures by tens of percent.

{table(kc, tc)}

`alloc/zeros/64MB` is not like for like on the CPU: kiln's zeros come from `calloc` (pages are
zeroed by the kernel when first touched, later), PyTorch writes them.

![GEMM]({rc}/gemm.png)
![bandwidth]({rc}/bandwidth.png)

### Training on the CPU (2 cores), same model and settings{"" if cpu_train == cpu else f" (rerun later than the CPU tables above, kiln then PyTorch back to back)"}

{training(trc, ttc)}

Curves: [CPU]({rct}/curves_cpu.png). CPU and CUDA runs from seed 0 agree within {agree:.2f}
points of test accuracy at every epoch.

## Regression check

`bench/baselines/h100.json` is the GPU report above and `bench/baselines/cpu.json` the CPU
one. `kiln bench check --baseline FILE --tolerance 10` reruns the baseline's suites on its
device and exits non-zero listing every metric more than 10% worse (`--current FILE` checks a
saved report instead).""")
