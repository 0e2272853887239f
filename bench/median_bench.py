#!/usr/bin/env python3
"""Merges repeated benchmark reports of one library and device (`kiln bench run` or
bench/torch_bench.py JSON, the same suites each time) into one: every row's value, median time
and % of peak are the medians over the runs, and the row keeps the range of its values
(`spread`: [min, max]) and the number of runs (`runs`). The header and peaks come from the
median too.

Why: on a shared 2-core host, memory bandwidth moves between minutes (the copy row read 53–112
GB/s across one day's rounds), so a row measured once for kiln and once for PyTorch a minute
apart compares two different machines. bench/cpu_run.sh alternates kiln and PyTorch runs of the
kernel suites and merges each library's runs with this script.

    python3 bench/median_bench.py kiln_run1.json kiln_run2.json kiln_run3.json > kiln_bench.json
"""
import json, statistics, sys


def median_peaks(peaks):
    """The median of each peak figure (numbers, or dicts of numbers by dtype) over the runs."""
    out = {}
    for key, v in peaks[0].items():
        if isinstance(v, dict):
            out[key] = median_peaks([p.get(key) or {} for p in peaks])
        elif isinstance(v, (int, float)):
            out[key] = statistics.median(p[key] for p in peaks if isinstance(p.get(key), (int, float)))
        else:
            out[key] = v
    return out


def main():
    reports = [json.load(open(p)) for p in sys.argv[1:]]
    if not reports:
        sys.exit("usage: median_bench.py REPORT.json...")
    first = reports[0]
    for path, r in zip(sys.argv[1:], reports):
        if (r.get("library"), r.get("device")) != (first.get("library"), first.get("device")):
            sys.exit(f"{path}: {r.get('library')} on {r.get('device')}, not "
                     f"{first.get('library')} on {first.get('device')}")
    rows = {}
    for r in reports:
        for rec in r["results"]:
            rows.setdefault(rec["name"], []).append(rec)
    merged = dict(first)
    merged["runs"] = len(reports)
    merged["results"] = []
    for name, recs in rows.items():
        out = dict(recs[0])
        values = [x["value"] for x in recs]
        out["value"] = statistics.median(values)
        out["median_ms"] = statistics.median(x["median_ms"] for x in recs)
        pcts = [x["pct_peak"] for x in recs if x.get("pct_peak") is not None]
        out["pct_peak"] = statistics.median(pcts) if pcts else None
        out["spread"] = [min(values), max(values)]
        out["runs"] = len(recs)
        merged["results"].append(out)
    merged["peaks"] = median_peaks([r.get("peaks") or {} for r in reports])
    json.dump(merged, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
