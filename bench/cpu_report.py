#!/usr/bin/env python3
"""The CPU table of docs/benchmarks.md: kiln before and after a change beside PyTorch, from
three `kiln bench run` / `bench/torch_bench.py` reports taken back to back on one machine;
with two reports (kiln, PyTorch) the table has no "before" column. "% copy" is a GB/s row's
kiln figure over kiln's copy row in the same report. Where AFTER.json sits beside the single
runs of `bench/cpu_run.sh` (runs/kiln_N.json, runs/torch_N.json), a "paired" column gives the
median over repeats of each repeat's own ratio: a repeat's kiln and PyTorch runs of a suite
are seconds apart, while the host's memory bandwidth moves between two levels (sum 16M read
45-55 or 85-100 GB/s, in both libraries) from minute to minute, so a ratio of medians can
set one library's fast runs against the other's slow ones.

    python3 bench/cpu_report.py [BEFORE.json] AFTER.json TORCH.json
"""
import glob, json, os, statistics, sys

COPY_ROW = "peak/copy/f32/4194304"


def load(path):
    d = json.load(open(path))
    recs = d.get("results") or d.get("records")
    meta = d.get("meta", d)
    return meta, {r["name"]: r for r in recs}


def ratio_of(a, t):
    """kiln over PyTorch, above 1 where kiln is faster."""
    if a["unit"] in ("us", "ns", "ms"):
        return t["value"] / a["value"]
    return a["value"] / t["value"]


def paired_ratios(after_path):
    """Row name -> median of the per-repeat ratios, from the runs beside AFTER.json."""
    runs = os.path.join(os.path.dirname(after_path) or ".", "runs")
    per_row = {}
    for kpath in sorted(glob.glob(os.path.join(runs, "kiln_[0-9]*.json"))):
        stem = os.path.basename(kpath)[len("kiln_"):-len(".json")]
        tpath = os.path.join(runs, f"torch_{stem}.json")
        if not stem.isdigit() or not os.path.exists(tpath):
            continue
        (_, k), (_, t) = load(kpath), load(tpath)
        for name, a in k.items():
            if name in t and a["value"] > 0 and t[name]["value"] > 0:
                per_row.setdefault(name, []).append(ratio_of(a, t[name]))
    return {name: statistics.median(v) for name, v in per_row.items()}


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
    paired = paired_ratios(paths[1])
    pcol = " paired |" if paired else ""
    if with_before:
        print(f"| workload | kiln before | kiln after | PyTorch | after / PyTorch |{pcol} after % copy |")
        print("|---|---|---|---|---|" + ("---|" if paired else "") + "---|")
    else:
        print(f"| workload | kiln | PyTorch | kiln / PyTorch |{pcol} kiln % copy |")
        print("|---|---|---|---|" + ("---|" if paired else "") + "---|")
    ratios = {}
    for name, a in after.items():
        t = torch.get(name)
        if t is None:
            continue
        ratio = ratio_of(a, t)
        if not name.startswith(("peak/", "overhead/", "alloc/")):
            ratios[name] = ratio
        # Of the table's copy row: its kiln figure and the row's are both medians over the
        # same runs. (Each process's own `pct_peak` divides by the copy it measured at its
        # start; with bench/cpu_run.sh running suite by suite those are other processes'
        # copies, 70–155 GB/s within one round, while GELU's 1M row held 62–64.)
        copy = after.get(COPY_ROW)
        pct = 100 * a["value"] / copy["value"] if copy else a.get("pct_peak")
        pct = f"{pct:.0f}%" if pct is not None and a["unit"] == "GB/s" else ""
        pair = ""
        if paired:
            pair = f" {paired[name]:.2f} |" if name in paired else " |"
        if with_before:
            print(f"| {name} | {fmt(before.get(name))} | {fmt(a)} | {fmt(t)} | {ratio:.2f} |{pair} {pct} |")
        else:
            print(f"| {name} | {fmt(a)} | {fmt(t)} | {ratio:.2f} |{pair} {pct} |")
    runs = meta.get("runs")
    if runs:
        print()
        print(f"kiln and PyTorch rows: medians of {runs} alternating runs each (the CNN epoch: one run).")
    kernel = {k: v for k, v in ratios.items() if not k.startswith("train/")}
    print()
    summary("Kernel rows (all but peak, overhead, alloc, train)", kernel)
    kernel_paired = {k: paired[k] for k in kernel if k in paired}
    if kernel_paired:
        summary("Paired (median of each repeat's ratio)", kernel_paired)


def summary(label, ratios):
    """One line: the geomean of `ratios` and its five lowest rows."""
    worst = sorted(ratios.items(), key=lambda kv: kv[1])[:5]
    geo = statistics.geometric_mean(ratios.values()) if ratios else float("nan")
    print(f"{label}: geomean {geo:.2f}× PyTorch; worst five: "
          + ", ".join(f"{k} {v:.2f}" for k, v in worst) + ".")


if __name__ == "__main__":
    main()
