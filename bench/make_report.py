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


def charts(d, rel):
    return "\n".join(f"![{n}]({rel}/{n}.png)" for n in ("gemm", "bandwidth") if os.path.exists(os.path.join(d, f"{n}.png")))


def graphs(gpu, kg, tg):
    """The launch-free training section: epochs eager and as CUDA graph replays beside
    PyTorch eager and PyTorch with the step in a CUDA graph, launch and kernel counts, the
    activation-epilogue A/B, and `kiln train`'s epochs (graph, eager; cold and warm cache)."""
    if not os.path.exists(os.path.join(gpu, "extra.json")):
        return "(no graph measurements in this results folder)"
    extra = load(gpu, "extra.json")
    k = {r["name"]: r["value"] for r in kg["results"]}
    t = {r["name"]: r["value"] for r in tg["results"]}
    out = ["| model | kiln eager ms | kiln graph ms | PyTorch eager ms | PyTorch graph ms | kiln graph / PyTorch graph | launches per eager step | kernels per recorded step | launches per graph step | kiln graph ms, activation epilogue off |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    noact = extra.get("train_suite_activation_epilogue_off", {})
    for h in (128, 1024):
        p = f"train/mlp784-{h}-10/b256/"
        kg_ms, tg_ms = k.get(p + "epoch-graph"), t.get(p + "epoch-graph")
        ratio = f"{kg_ms / tg_ms:.2f}" if kg_ms and tg_ms else ""
        f = lambda v: f"{v:.2f}" if isinstance(v, (int, float)) else ""
        out.append(f"| 784-{h}-10 | {f(k.get(p + 'epoch'))} | {f(kg_ms)} | {f(t.get(p + 'epoch'))} | {f(tg_ms)} | {ratio} | "
                   f"{f(k.get(p + 'launches-per-step'))} | {f(k.get(p + 'graph-kernels'))} | {f(k.get(p + 'launches-per-step-graph'))} | "
                   f"{f(noact.get(p + 'epoch-graph'))} |")
    eager_path = os.path.join(gpu, "kiln_train_cuda_eager.json")
    trg = load(gpu, "kiln_train_cuda.json")
    med = lambda e: sorted(x["seconds"] * 1e3 for x in e[1:])[len(e[1:]) // 2]
    lines = ["\n".join(out), ""]
    if os.path.exists(eager_path):
        tre = load(gpu, "kiln_train_cuda_eager.json")
        diff = max(abs(a["train_loss"] - b["train_loss"]) / abs(b["train_loss"])
                   for a, b in zip(trg["epochs"], tre["epochs"]))
        acc = max(abs(a["test_acc"] - b["test_acc"]) for a, b in zip(trg["epochs"], tre["epochs"])) * 100
        lines.append(f"`kiln train` defaults: median of epochs 2–10 {med(trg['epochs']):.1f} ms with graphs "
                     f"(`--graph auto`), {med(tre['epochs']):.1f} ms eager (`--graph off`). The two runs are "
                     f"separate processes, and each times its GEMM candidates afresh (timing noise can pick another "
                     f"algorithm, so another summation order): training losses differ by at most {diff:.1e} "
                     f"relative, test accuracy by at most {acc:.2f} points. In one process (plans shared) graph and "
                     f"eager runs are bitwise equal: the test `graph_modes_train_alike` asserts it; "
                     f"`KILN_GEMM_AUTOTUNE=0` keeps the heuristic's first choice instead, the same in every run.")
    lines.append(f"First epoch (warm-up step, recording, kernels): {extra['cold_first_epoch_ms']:.0f} ms with an empty "
                 f"kernel cache, {extra['warm_first_epoch_ms']:.0f} ms with a warm one (whole 2-epoch runs "
                 f"{extra['cold_whole_run_ms']} and {extra['warm_whole_run_ms']} ms, process start to exit).")
    return "\n".join(lines)


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

{charts(gpu, rg)}

### Launch-free training: the step as a CUDA graph (same MLP shapes, random data, 234 steps of 256)

PyTorch's graph twin records the whole step (gather by index, forward, loss, backward,
`SGD(fused=True)`, running sums) with `torch.cuda.graph` after a side-stream warm-up, as kiln
records its step. "launches" count kernels, library calls and graph launches queued by kiln
(`kiln::cuda::launch_count`); "kernels per recorded step" are the graph's kernel nodes.

{graphs(gpu, kg, tg)}

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
