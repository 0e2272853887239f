"""Joins `kiln bench dist` and `bench/torch_ddp.py` JSON lines (kiln_dist_N.jsonl,
torch_ddp_N.jsonl in one folder) into the scaling and all-reduce tables (markdown)."""
import glob, json, os, sys

d = sys.argv[1]
rows = {}
for path in glob.glob(os.path.join(d, "*_dist_*.jsonl")) + glob.glob(os.path.join(d, "torch_ddp_*.jsonl")):
    for line in open(path):
        r = json.loads(line)
        rows[(r["framework"], r["name"], r["world"])] = r
names = sorted({n for _, n, _ in rows}, key=lambda n: (not n.startswith("all_reduce"), n))
worlds = sorted({w for _, _, w in rows})
print("| figure | GPUs | kiln | PyTorch | kiln / PyTorch | kiln scaling over 1 GPU |")
print("|---|---|---|---|---|---|")
for n in names:
    for w in worlds:
        k, t = rows.get(("kiln", n, w)), rows.get(("pytorch", n, w))
        if not k and not t:
            continue
        one = rows.get(("kiln", n, 1))
        fmt = lambda r: f"{r['value']:.1f} {r['unit']}" if r else "—"
        ratio = f"{k['value'] / t['value']:.2f}" if k and t else "—"
        scale = f"{k['value'] / one['value']:.2f}×" if k and one and w > 1 and not n.startswith("all_reduce") else ""
        print(f"| {n} | {w} | {fmt(k)} | {fmt(t)} | {ratio} | {scale} |")
