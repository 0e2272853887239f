#!/usr/bin/env python3
"""Merges benchmark reports of one library and device (kiln bench run or bench/torch_bench.py
JSON) taken in separate runs of the same call, for bench/make_report.py: the first file's
header and peaks (a peak the first lacks from the first that has it), then every result whose
name has not come yet.

    python3 bench/merge_bench.py kiln_base.json kiln_rest.json > kiln_bench.json
"""
import json, sys

merged = None
for path in sys.argv[1:]:
    report = json.load(open(path))
    if merged is None:
        merged = report
        seen = {r["name"] for r in merged["results"]}
        continue
    if (report.get("library"), report.get("device")) != (merged.get("library"), merged.get("device")):
        sys.exit(f"{path}: {report.get('library')} on {report.get('device')}, not "
                 f"{merged.get('library')} on {merged.get('device')}")
    # Peaks a suite measures (the GEMM peak comes with the gemm suite) fill those still empty.
    peaks = merged.setdefault("peaks", {})
    for key, v in (report.get("peaks") or {}).items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                peaks.setdefault(key, {}).setdefault(k2, v2)
        else:
            peaks.setdefault(key, v)
    for r in report["results"]:
        if r["name"] not in seen:
            merged["results"].append(r)
            seen.add(r["name"])
json.dump(merged, sys.stdout, indent=2)
print()
