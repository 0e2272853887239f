#!/usr/bin/env python3
"""Writes docs/benchmarks.md from a results folder (kiln_bench.json, torch_bench.json,
kiln_train_cuda.json, torch_train_cuda.json, kiln_train_cpu_2core.json).

    python3 bench/make_report.py bench/results/2026-11-21-h100 > docs/benchmarks.md
"""
import json, os, sys

d = sys.argv[1]
load = lambda f: json.load(open(os.path.join(d, f)))
k, t = load("kiln_bench.json"), load("torch_bench.json")
tm = {r["name"]: r for r in t["results"]}
rows = []
for r in k["results"]:
    o = tm.get(r["name"])
    if not o:
        continue
    hib = r["unit"] not in ("us", "ns", "ms")
    ratio = r["value"] / o["value"] if hib else o["value"] / r["value"]
    pct = f"{r['pct_peak']:.0f}%" if r.get("pct_peak") else ""
    rows.append(f"| {r['name']} | {r['value']:.2f} {r['unit']} | {o['value']:.2f} {o['unit']} | {ratio:.2f} | {pct} |")
only = [r for r in t["results"] if r["name"] not in {x["name"] for x in k["results"]}]
kt, tt, cpu = load("kiln_train_cuda.json")["epochs"], load("torch_train_cuda.json")["epochs"], load("kiln_train_cpu_2core.json")["epochs"]
rel = os.path.relpath(d, "docs")
print(f"""# Benchmarks

Every figure is kiln beside PyTorch on the same device in the same run: `kiln bench run` and
`bench/torch_bench.py` time the same workloads (device events per repeat after warm-up,
medians, random data, inputs rotated among buffers larger than the L2). The ratio is kiln's
advantage: value/value for rates, inverted for times (above 1: kiln ahead). "% peak" is of the
device copy bandwidth (bytes read + written) or of the best GEMM rate of that precision,
both measured in the same run.

## {k['device_name']} ({k['date'][:10]}, commit {k['commit']}, PyTorch {t['version']})

Reproduce: here `../shared/tools/gpu-bundle --bins --data /usr/share/datasets/fashion-mnist`
and `tar -cf - .gpu | xz > .gpucarry/gpu.tar.xz`; on the GPU machine (device tool, carry
`.gpucarry`) `bash bench/gpu_run.sh bench` (`kiln bench run --device cuda`,
`python3 bench/torch_bench.py`, `kiln bench compare`) and `bash bench/gpu_run.sh train`
(`kiln train --device cuda` beside `bench/torch_train.py`); then
`python3 bench/make_report.py {d} > docs/benchmarks.md`.

| workload | kiln | PyTorch | ratio | kiln % peak |
|---|---|---|---|---|""")
print("\n".join(rows))
print("""
Measured by PyTorch only (kiln has no pinned host tensors yet; its transfers above are from
and to ordinary host memory):

| workload | PyTorch |
|---|---|""")
print("\n".join(f"| {r['name']} | {r['value']:.2f} {r['unit']} |" for r in only))
print("""
### Training: MLP 784-128-10, batch 256, 234 steps per epoch, SGD momentum 0.9, lr 0.05 cosine

| epoch | kiln CUDA ms | PyTorch eager CUDA ms | kiln test acc | PyTorch test acc | kiln CPU ms (2 cores) | kiln CPU test acc |
|---|---|---|---|---|---|---|""")
for a, b, c in zip(kt, tt, cpu):
    print(f"| {a['epoch']} | {a['seconds']*1e3:.1f} | {b['seconds']*1e3:.1f} | {100*a['test_acc']:.2f}% | {100*b['test_acc']:.2f}% | {c['seconds']*1e3:.0f} | {100*c['test_acc']:.2f}% |")
print(f"""
The first epoch includes loading kernels (and, on a fresh machine, compiling them). The kiln
checkpoint of the last epoch loads in PyTorch (`safetensors.torch.load_file` +
`load_state_dict`) and scores {100*load('torch_train_cuda.json').get('kiln_checkpoint_test_acc', float('nan')):.2f}% there. CPU and CUDA runs from seed 0 agree
within {max(abs(a['test_acc']-c['test_acc']) for a, c in zip(kt, cpu))*100:.2f} points at every epoch.

Curves: [CUDA]({rel}/curves_cuda.png), [CPU]({rel}/curves_cpu_2core.png).

![GEMM]({rel}/gemm.png)
![bandwidth]({rel}/bandwidth.png)

The charts come from `kiln bench compare kiln_bench.json torch_bench.json --plots DIR`.

## Regression check

`bench/baselines/h100.json` is the kiln report above and `bench/baselines/cpu.json` a run on
the 2-core CPU machine. `kiln bench check --baseline FILE --tolerance 10` reruns the baseline's
suites on its device and exits non-zero listing every metric more than 10% worse
(`--current FILE` checks a saved report instead).

## Not measured yet

PyTorch on the 2-core CPU machine (PyPI has no CPU-only wheel of a practical size), and the
`alloc` and `train` suites of `kiln bench`.""")
