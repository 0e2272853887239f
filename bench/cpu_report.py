#!/usr/bin/env python3
"""The CPU table of docs/benchmarks.md: kiln before and after a change beside PyTorch, from
three `kiln bench run` / `bench/torch_bench.py` reports taken back to back on one machine;
with two reports (kiln, PyTorch) the table has no "before" column. "% copy" is a GB/s row's
kiln figure over kiln's copy row in the same report.

    python3 bench/cpu_report.py [BEFORE.json] AFTER.json TORCH.json
"""
import json, statistics, sys

COPY_ROW = "peak/copy/f32/4194304"


def load(path):
    d = json.load(open(path))
    recs = d.get("results") or d.get("records")
    meta = d.get("meta", d)
    return meta, {r["name"]: r for r in recs}


def fmt(r):
    if r is None:
        return "–"
    v, u = r["value"], r["unit"]
    if u in ("us", "ns", "ms"):
        return f"{v:.2f} {u}"
    return f"{v:.2f} {u}"


def main():
    paths = sys.argv[1:4]
    with_before = len(paths) == 3
    if not with_before:
        paths = [paths[0]] + paths
    (_, before), (meta, after), (tmeta, torch) = (load(p) for p in paths)
    if with_before:
        print("| workload | kiln before | kiln after | PyTorch | after / PyTorch | after % copy |")
        print("|---|---|---|---|---|---|")
    else:
        print("| workload | kiln | PyTorch | kiln / PyTorch | kiln % copy |")
        print("|---|---|---|---|---|")
    ratios = {}
    for name, a in after.items():
        t = torch.get(name)
        if t is None:
            continue
        lower_is_better = a["unit"] in ("us", "ns", "ms")
        ratio = (t["value"] / a["value"]) if lower_is_better else (a["value"] / t["value"])
        if not name.startswith(("peak/", "overhead/", "alloc/")):
            ratios[name] = ratio
        # Of the table's copy row: its kiln figure and the row's are both medians over the
        # same runs. (Each process's own `pct_peak` divides by the copy it measured at its
        # start; with bench/cpu_run.sh running suite by suite those are other processes'
        # copies, 70–155 GB/s within one round, while GELU's 1M row held 62–64.)
        copy = after.get(COPY_ROW)
        pct = 100 * a["value"] / copy["value"] if copy else a.get("pct_peak")
        pct = f"{pct:.0f}%" if pct is not None and a["unit"] == "GB/s" else ""
        if with_before:
            print(f"| {name} | {fmt(before.get(name))} | {fmt(a)} | {fmt(t)} | {ratio:.2f} | {pct} |")
        else:
            print(f"| {name} | {fmt(a)} | {fmt(t)} | {ratio:.2f} | {pct} |")
    runs = meta.get("runs")
    if runs:
        print()
        print(f"kiln and PyTorch rows: medians of {runs} alternating runs each (the CNN epoch: one run).")
    kernel = {k: v for k, v in ratios.items() if not k.startswith("train/")}
    worst = sorted(kernel.items(), key=lambda kv: kv[1])[:5]
    geo = statistics.geometric_mean(kernel.values()) if kernel else float("nan")
    print()
    print(f"Kernel rows (all but peak, overhead, alloc, train): geomean {geo:.2f}× PyTorch; worst five: "
          + ", ".join(f"{k} {v:.2f}" for k, v in worst) + ".")


if __name__ == "__main__":
    main()
