"""kiln against PyTorch on one CPU op, in two live processes taking turns (ABBA), so that both
see the same minutes of a noisy host:
    python bench/tools/abba.py OP N [C] [--turns T] [--burst B]
A turn is B calls back to back (the median of all but the first two, as a benchmark's
warm loop); between turns the driver sleeps --gap-ms (default 30) so that the idle side's
spinning workers have parked before the other side runs: PyTorch's OpenMP workers (libgomp)
spin for milliseconds after each op, and with a 5 ms gap kiln's 1M-element ops ran at one
thread's rate in half the turns (session 54). Host noise still moves single runs by ±30%. kiln's side is
`bench/tools/cpu_micro serve` (build it first). Prints each side's median over the turns,
the ratio PyTorch / kiln (above 1: kiln faster) and in how many turn pairs kiln was faster."""
import argparse, statistics, subprocess, time, torch

p = argparse.ArgumentParser()
p.add_argument("op"); p.add_argument("n", type=int); p.add_argument("c", type=int, nargs="?")
p.add_argument("--turns", type=int, default=60)
p.add_argument("--burst", type=int, default=7)
p.add_argument("--gap-ms", type=float, default=30.0)
p.add_argument("--bin", default="bench/tools/cpu_micro/target/release/cpu_micro")
a = p.parse_args()
torch.set_num_threads(2)
shape = (a.n,) if a.c is None else (a.n, a.c)
x, y = torch.randn(shape), torch.randn(shape)
ops = {"sum": lambda: x.sum(), "max": lambda: x.max(), "relu": lambda: torch.relu(x),
       "add": lambda: x + y, "mul": lambda: x * y, "softmax": lambda: torch.softmax(x, -1),
       "log_softmax": lambda: torch.log_softmax(x, -1)}
f = ops[a.op]
args = [a.bin, "serve", a.op, str(a.n)] + ([] if a.c is None else [str(a.c)])
k = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)


def kiln_turn():
    k.stdin.write(f"{a.burst}\n"); k.stdin.flush()
    us = float(k.stdout.readline()); time.sleep(a.gap_ms / 1e3); return us


def torch_turn():
    v = []
    for _ in range(a.burst):
        t = time.perf_counter(); f(); v.append((time.perf_counter() - t) * 1e6)
    time.sleep(a.gap_ms / 1e3)
    return statistics.median(v[2:])


for _ in range(3):
    kiln_turn(); torch_turn()
kt, tt = [], []
for i in range(a.turns):
    if i % 2 == 0:
        kt.append(kiln_turn()); tt.append(torch_turn())
    else:
        tt.append(torch_turn()); kt.append(kiln_turn())
k.stdin.write("quit\n"); k.stdin.flush(); k.wait()
km, tm = statistics.median(kt), statistics.median(tt)
wins = sum(1 for u, v in zip(kt, tt) if u < v)
q = lambda v: " ".join(f"{s:.0f}" for s in statistics.quantiles(v, n=10))
print("kiln deciles", q(kt)); print("torch deciles", q(tt))
print(f"{a.op} {shape}: kiln {km:9.1f} us  torch {tm:9.1f} us  torch/kiln {tm / km:5.2f}  "
      f"kiln faster in {wins}/{len(kt)} turn pairs")
