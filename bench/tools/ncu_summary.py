# Prints each kernel of an `ncu --csv --metrics gpu__time_duration.sum` log with its duration.
import csv, sys
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit"); gi = h.index("Grid Size"); bi = h.index("Block Size")
tot = 0
for r in rows[1:]:
    v = float(r[vi].replace(',', '')); unit = r[ui]
    us = v * {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[unit]
    tot += us
    print(f"{us:8.2f} us  {r[gi]:>14} {r[bi]:>12}  {r[ki][:90]}")
print(f"total {tot:.1f} us over {len(rows)-1} kernels")
