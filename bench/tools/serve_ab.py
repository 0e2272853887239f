"""Two builds of `cpu_micro` on one op, process against process: NPROC processes of each,
alternating (ABBA), each timing 6 bursts of 15 calls (`cpu_micro serve`); prints each
build's per-process medians. Whole processes of the 2-core EPYC ran at one of two rates
(session 54), so a comparison needs many processes, not many calls in one.
    python bench/tools/serve_ab.py NPROC BIN_A BIN_B -- OP ARGS...
e.g. `... 10 /tmp/cpu_micro_before bench/tools/cpu_micro/target/release/cpu_micro -- softmax 4096 1024`."""
import subprocess, sys, statistics
nproc = int(sys.argv[1]); bins = sys.argv[2:4]; op = sys.argv[5:]
res = {b: [] for b in bins}
for p in range(nproc):
    order = bins if p % 2 == 0 else bins[::-1]
    for b in order:
        k = subprocess.Popen([b, "serve", *op], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        v = []
        for i in range(6):
            k.stdin.write("15\n"); k.stdin.flush(); v.append(float(k.stdout.readline()))
        k.stdin.write("quit\n"); k.stdin.flush(); k.wait()
        res[b].append(round(statistics.median(v[1:])))
for b in bins:
    print(f"{' '.join(op):24} {b.split('/')[-1]:18} median {statistics.median(res[b]):8.0f}  per process {res[b]}")
