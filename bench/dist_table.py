"""Joins `kiln bench dist` and `bench/torch_ddp.py` JSON lines (kiln_dist_N.jsonl,
torch_ddp_N.jsonl in one folder) into the scaling and all-reduce tables (markdown)."""
import glob, json, os, sys

d = sys.argv[1]
rows = {}
for path in glob.glob(os.path.join(d, "*_dist_*.jsonl")) + glob.glob(os.path.join(d, "torch_ddp_*.jsonl")):
    for line in open(path):
        r = json.loads(line)
        rows[(r["framework"], r["name"], r["world"])] = r
def order(n):
    # all-reduce rows by size, then the training rows
    if n.startswith("all_reduce"):
        v, unit = n.split()[1:3]
        return (0, float(v) * (1024 if unit == "GB" else 1))
    return (1, n)


names = sorted({n for _, n, _ in rows}, key=order)
worlds = sorted({w for _, _, w in rows})
print("| figure | GPUs | kiln | PyTorch | kiln / PyTorch | scaling over 1 GPU: kiln | PyTorch |")
print("|---|---|---|---|---|---|---|")
for n in names:
    for w in worlds:
        # A one-rank all-reduce moves nothing: its "bandwidth" means nothing.
        if n.startswith("all_reduce") and w == 1:
            continue
        k, t = rows.get(("kiln", n, w)), rows.get(("pytorch", n, w))
        if not k and not t:
            continue
        fmt = lambda r: f"{r['value']:.1f} {r['unit']}" if r else "—"
        ratio = f"{k['value'] / t['value']:.2f}" if k and t else "—"

        def scale(fw, r):
            one = rows.get((fw, n, 1))
            ok = r and one and w > 1 and not n.startswith("all_reduce")
            return f"{r['value'] / one['value']:.2f}×" if ok else ""

        print(f"| {n} | {w} | {fmt(k)} | {fmt(t)} | {ratio} | {scale('kiln', k)} | {scale('pytorch', t)} |")
