#!/usr/bin/env python3
"""Markdown table of the conv and cnn suites: kiln beside PyTorch now, and kiln / PyTorch
before (another kiln build's run, with its own PyTorch run from the same call).

    python3 bench/conv_table.py BEFORE_KILN.json BEFORE_TORCH.json KILN.json TORCH.json
"""
import json
import sys


def load(path):
    return {r["name"]: r for r in json.load(open(path))["results"]}


def ratio(k, t):
    # Rates (TFLOP/s) compare directly; times (ms, us) inversely.
    return t["value"] / k["value"] if k["unit"] in ("ms", "us") else k["value"] / t["value"]


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    bk, bt, k, t = (load(p) for p in sys.argv[1:])
    print("| workload | before: kiln / PyTorch | now: kiln | now: PyTorch | now: kiln / PyTorch |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, r in k.items():
        if not name.startswith(("conv/", "train/cnn")) or name not in t:
            continue
        before = f"{ratio(bk[name], bt[name]):.2f}x" if name in bk and name in bt else "–"
        unit = r["unit"]
        print(f"| {name} | {before} | {r['value']:.2f} {unit} | {t[name]['value']:.2f} {unit} "
              f"| {ratio(r, t[name]):.2f}x |")


if __name__ == "__main__":
    main()
