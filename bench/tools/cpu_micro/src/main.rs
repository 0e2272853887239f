//! Single-op CPU timings (see Cargo.toml for the modes).
use kiln::{Device, DType, Generator, Tensor};
use std::time::Instant;
mod tile;
fn time(f: impl Fn()) -> f64 {
    for _ in 0..3 { f(); }
    let mut v = vec![];
    for _ in 0..31 { let t = Instant::now(); f(); v.push(t.elapsed().as_secs_f64()); }
    v.sort_by(|a,b| a.partial_cmp(b).unwrap()); v[v.len()/2]
}
fn main() {
    kiln::retain_freed_host_memory();
    if std::env::var("PIN").is_ok() {
        // Diagnostic: the global pool's worker i pinned to CPU i.
        rayon::ThreadPoolBuilder::new().num_threads(2).start_handler(|i| {
            // SAFETY: a zeroed cpu_set_t is an empty set; only this thread's affinity is set.
            unsafe { let mut s: libc::cpu_set_t = std::mem::zeroed(); libc::CPU_SET(i, &mut s); libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &s); }
        }).build_global().unwrap();
    }
    let mut rng = Generator::new(0);
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map(|s| s.as_str()).unwrap_or("unary");
    if what == "tile" {
        assert!(is_x86_feature_detected!("avx512f"));
        tile::run();
    } else if what == "tile2" {
        assert!(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"));
        tile::run_avx2();
    } else if what == "serve" {
        // One op, timed in bursts on request from stdin (the µs printed back): for
        // bench/tools/abba.py, which alternates it with PyTorch's op call by call.
        //   cpu_micro serve OP N [C]   OP: sum, max, relu, add, mul, softmax, log_softmax ([N, C])
        use std::io::BufRead;
        let op = args.get(2).cloned().unwrap_or_else(|| "sum".into());
        let n: usize = args.get(3).map(|s| s.parse().unwrap()).unwrap_or(1 << 24);
        let cols: Option<usize> = args.get(4).map(|s| s.parse().unwrap());
        let shape: Vec<usize> = cols.map_or(vec![n], |c| vec![n, c]);
        let x = Tensor::randn(shape.clone(), 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let y = Tensor::randn(shape, 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let run = || match op.as_str() {
            "sum" => drop(x.sum(kiln::AllDims, false).unwrap()),
            "max" => drop(x.max(kiln::AllDims, false).unwrap()),
            "relu" => drop(x.relu().unwrap()),
            "add" => drop(x.add(&y).unwrap()),
            "mul" => drop(x.mul(&y).unwrap()),
            "softmax" => drop(x.softmax(-1).unwrap()),
            "log_softmax" => drop(x.log_softmax(-1).unwrap()),
            other => panic!("serve: unknown op {other}"),
        };
        let stdin = std::io::stdin();
        // Each line: a burst of B calls back to back; the median of all but the first two.
        for line in stdin.lock().lines() {
            let line = line.unwrap();
            if line.trim() == "quit" { break; }
            let burst: usize = line.trim().parse().unwrap_or(1).max(3);
            let mut v: Vec<f64> = (0..burst).map(|_| { let t = Instant::now(); run(); t.elapsed().as_secs_f64() * 1e6 }).skip(2).collect();
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            println!("{:.3}", v[v.len() / 2]);
        }
    } else if what == "chansum" {
        // A bias or batch-norm gradient: the sum of [n, c, h, w] over (0, 2, 3), µs (median).
        for (n, c, hw) in [(256usize, 64usize, 14usize), (256, 32, 28), (64, 128, 28), (8, 512, 7)] {
            let g = Tensor::randn([n, c, hw, hw], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
            let s = time(|| { g.sum(vec![0, 2, 3], false).unwrap(); });
            println!("sum over (0, 2, 3) of [{n}, {c}, {hw}, {hw}]: {:8.1} us, {:6.1} GB/s", s * 1e6, (n * c * hw * hw * 4) as f64 / s / 1e9);
        }
    } else if what == "fmapeak" {
        assert!(is_x86_feature_detected!("avx512f"));
        tile::run_fma_peak();
    } else if what == "wgtile" {
        assert!(is_x86_feature_detected!("avx512f"));
        tile::run_wg();
    } else if what == "unary" {
        let n: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(1 << 14);
        let x = Tensor::randn([n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let ops: Vec<(&str, fn(&Tensor) -> kiln::Result<Tensor>)> = vec![
            ("copy", |t| t.copy()), ("relu", Tensor::relu), ("exp", Tensor::exp), ("log", |t| t.abs()?.log()), ("tanh", Tensor::tanh),
            ("sigmoid", Tensor::sigmoid), ("silu", Tensor::silu), ("erf", Tensor::erf), ("gelu", Tensor::gelu), ("gelu_tanh", Tensor::gelu_tanh),
            ("sum", |t| t.sum(0, false)), ("max", |t| t.max(0, false)), ("argmax", |t| t.argmax(0, false))];
        // OPS=tanh,sigmoid times only those (for a profile of one kernel).
        let only = std::env::var("OPS").ok();
        for (name, f) in ops {
            if only.as_ref().is_some_and(|o| !o.split(',').any(|n| n == name)) { continue; }
            let s = time(|| { f(&x).unwrap(); });
            println!("{name:10} {:7.3} ns/elem  {:7.2} GB/s  {:8.2} us", s * 1e9 / n as f64, 8.0 * n as f64 / s / 1e9, s*1e6);
        }
    } else if what == "gelu_backward" {
        // GELU forward, then its backward from an upstream gradient of ones (the derivative
        // times the gradient): ns per element of each, one op each.
        let n: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(1 << 14);
        let x = Tensor::randn([n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap().var().unwrap();
        let g = Tensor::ones([n], DType::F32, &Device::Cpu).unwrap();
        let fwd = time(|| { x.gelu().unwrap(); });
        let both = time(|| { x.gelu().unwrap().backward_with(&g).unwrap(); });
        println!("gelu forward {:7.3} ns/elem, forward + backward {:7.3} ns/elem", fwd * 1e9 / n as f64, both * 1e9 / n as f64);
    } else if what == "sgd" {
        // One SGD step with momentum (the fused update) of n parameters, us (median).
        let n: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(784 * 1024);
        let p = Tensor::randn([n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let g = Tensor::randn([n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let v = Tensor::randn([n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let rule = kiln::op::UpdateRule::Sgd { lr: 1e-6, momentum: 0.9, nesterov: false, weight_decay: 0.0 };
        let s = time(|| p.apply_update(&g, &[&v], rule).unwrap());
        println!("sgd momentum {n}: {:8.1} us  {:6.1} GB/s", s * 1e6, 20.0 * n as f64 / s / 1e9);
    } else if what == "helpercheck" {
        // 2000 adds of n elements: the median, 10th and 90th percentile (us), then every
        // thread of this process with the CPU it last ran on and its context switches.
        let n: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(1 << 16);
        let a = Tensor::randn([n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let b = Tensor::randn([n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let mut v = vec![];
        for _ in 0..2000 { let t = Instant::now(); a.add(&b).unwrap(); v.push(t.elapsed().as_secs_f64() * 1e6); }
        v.sort_by(|x, y| x.partial_cmp(y).unwrap());
        print!("p10 {:6.2} p50 {:6.2} p90 {:6.2} us |", v[200], v[1000], v[1800]);
        for e in std::fs::read_dir("/proc/self/task").unwrap() {
            let dir = e.unwrap().path();
            let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
            let comm = stat[stat.find('(').unwrap() + 1..stat.rfind(')').unwrap()].to_string();
            let cpu: &str = stat[stat.rfind(')').unwrap() + 2..].split(' ').nth(36).unwrap();
            let status = std::fs::read_to_string(dir.join("status")).unwrap();
            let sw: Vec<&str> = status.lines().filter(|l| l.contains("ctxt_switches")).map(|l| l.split_whitespace().last().unwrap()).collect();
            print!(" {comm}@cpu{cpu} sw {}/{}", sw[0], sw[1]);
        }
        println!();
    } else if what == "binary" {
        // add and mul of two n-element tensors, new output and in place, us (median).
        let n: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(1 << 20);
        let a = Tensor::randn([n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let b = Tensor::randn([n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let c = Tensor::randn([n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let t_add = time(|| { a.add(&b).unwrap(); });
        let t_relu = time(|| { a.relu().unwrap(); });
        let t_assign = time(|| { c.add_assign(&b).unwrap(); });
        println!("add {:8.2} us  relu {:8.2} us  add_assign {:8.2} us", t_add * 1e6, t_relu * 1e6, t_assign * 1e6);
    } else if what == "grain" {
        for n in [8192usize, 16384, 32768, 65536, 131072, 262144, 1 << 20] {
            let x = Tensor::randn([n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
            let y = Tensor::randn([n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
            let mut line = format!("{n:8}");
            for (name, f) in [("add", (|a: &Tensor, b: &Tensor| a.add(b)) as fn(&Tensor, &Tensor) -> kiln::Result<Tensor>), ("exp", |a, _| a.exp()), ("gelu", |a, _| a.gelu())] {
                let mut t = [0.0; 2];
                for (i, th) in [1usize, 2].into_iter().enumerate() {
                    kiln::set_num_threads(th).unwrap();
                    t[i] = time(|| { f(&x, &y).unwrap(); });
                }
                line += &format!("  {name} 1t {:7.1}us 2t {:7.1}us ({:.2}x)", t[0]*1e6, t[1]*1e6, t[0]/t[1]);
            }
            println!("{line}");
        }
    } else if what == "softmax" {
        // softmax and log_softmax of [rows, n] along the last dim (default 4096x1024), 1 and 2
        // threads: µs (median), GB/s (read + write) and ns per element per thread.
        let rows: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(4096);
        let n: usize = args.get(3).map(|s| s.parse().unwrap()).unwrap_or(1024);
        let x = Tensor::randn([rows, n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        for th in [1usize, 2] {
            kiln::set_num_threads(th).unwrap();
            let s = time(|| { x.softmax(1).unwrap(); });
            let l = time(|| { x.log_softmax(1).unwrap(); });
            let e = (rows * n) as f64;
            println!("{rows}x{n} {th}t  softmax {:8.1} us {:6.1} GB/s {:.3} ns/elem/thread  log_softmax {:8.1} us {:6.1} GB/s", s * 1e6, 8.0 * e / s / 1e9, s * 1e9 * th as f64 / e, l * 1e6, 8.0 * e / l / 1e9);
        }
    } else if what == "sum" {
        // sum and max of n f32 (default 16M), 1 and 2 threads: µs (median) and GB/s.
        let n: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(1 << 24);
        let x = Tensor::randn([n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        for th in [1usize, 2] {
            kiln::set_num_threads(th).unwrap();
            let s = time(|| { x.sum(kiln::AllDims, false).unwrap(); });
            let m = time(|| { x.max(kiln::AllDims, false).unwrap(); });
            println!("{n} {th}t  sum {:8.1} us {:6.1} GB/s  max {:8.1} us {:6.1} GB/s", s * 1e6, 4.0 * n as f64 / s / 1e9, m * 1e6, 4.0 * n as f64 / m / 1e9);
        }
    } else if what == "assign" {
        // x += y in place, 1M elements, per dtype: µs (median).
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let x = Tensor::randn([1 << 20], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap().to_dtype(dtype).unwrap();
            let y = Tensor::randn([1 << 20], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap().to_dtype(dtype).unwrap();
            let t = time(|| { x.add_assign(&y).unwrap(); });
            println!("add_assign 1M {dtype}: {:.1} us", t * 1e6);
        }
        // Layouts other than two contiguous runs: a row broadcast into a contiguous matrix,
        // and a contiguous source into a narrowed (strided) destination.
        let m = Tensor::randn([1024, 2048], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let row = Tensor::randn([1024], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let half = m.narrow(1, 512, 1024).unwrap();
        let full = Tensor::randn([1024, 1024], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let t = time(|| { full.add_assign(&row).unwrap(); });
        println!("add_assign [1024,1024] += [1024] (broadcast) f32: {:.1} us", t * 1e6);
        let t = time(|| { half.add_assign(&full).unwrap(); });
        println!("add_assign narrowed [1024,1024 of 2048] += contiguous f32: {:.1} us", t * 1e6);
    } else if what == "mm" {
        // Products with a transposed left operand, as a view and copied out first: µs
        // (median). MM=m,k,n (default: the 256 square and the MLP's weight gradients).
        let shapes: Vec<[usize; 3]> = match std::env::var("MM") {
            Ok(v) => {
                let p: Vec<usize> = v.split(',').map(|t| t.parse().unwrap()).collect();
                vec![[p[0], p[1], p[2]]]
            }
            Err(_) => vec![[256, 256, 256], [784, 256, 1024], [784, 256, 128], [1024, 256, 10], [128, 256, 10]],
        };
        for [m, k, n] in shapes {
            let a = Tensor::randn([k, m], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
            let b = Tensor::randn([k, n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
            let ac = a.t().unwrap().contiguous().unwrap();
            let view = time(|| { a.t().unwrap().matmul(&b).unwrap(); });
            let copied = time(|| { a.t().unwrap().contiguous().unwrap().matmul(&b).unwrap(); });
            let nn = time(|| { ac.matmul(&b).unwrap(); });
            let fl = 2.0 * (m * n * k) as f64 / 1e9;
            println!("{m}x{k}x{n}: a.t() view {:.1} us ({:.0} GFLOP/s), copied first {:.1} us, contiguous a {:.1} us ({:.0} GFLOP/s)",
                view * 1e6, fl / view, copied * 1e6, nn * 1e6, fl / nn);
        }
    } else if what == "views" {
        // A transpose view made and dropped in a loop (for perf), ns per view.
        let x = Tensor::randn([64, 64, 64], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let iters = 20_000_000;
        let t = Instant::now();
        for _ in 0..iters {
            drop(std::hint::black_box(std::hint::black_box(&x).transpose(0, 2).unwrap()));
        }
        println!("transpose {:.2} ns", t.elapsed().as_secs_f64() * 1e9 / iters as f64);
    } else if what == "conv" {
        // The CNN's two layers (batch 256, 5x5, padding 2): each pass alone, ms (median).
        use kiln::Conv2dOptions;
        let d = Device::Cpu;
        if let Ok(th) = std::env::var("THREADS") { kiln::set_num_threads(th.parse().unwrap()).unwrap(); }
        // CONV=n,c_in,size,c_out,k,pad picks one other shape (batch n).
        let shapes: Vec<(String, usize, usize, usize, usize, usize, usize)> = match std::env::var("CONV") {
            Ok(v) => {
                let p: Vec<usize> = v.split(',').map(|t| t.parse().unwrap()).collect();
                vec![(format!("conv b{} {}->{} {}x{} k{}", p[0], p[1], p[3], p[2], p[2], p[4]), p[0], p[1], p[2], p[3], p[4], p[5])]
            }
            Err(_) => vec![("conv1 1->32 28x28".into(), 256, 1, 28, 32, 5, 2), ("conv2 32->64 14x14".into(), 256, 32, 14, 64, 5, 2)],
        };
        for (name, batch, c_in, size, c_out, k, pad) in shapes {
            let x = Tensor::randn([batch, c_in, size, size], 0.0, 1.0, DType::F32, &d, &mut rng).unwrap();
            let w = Tensor::randn([c_out, c_in, k, k], 0.0, 0.1, DType::F32, &d, &mut rng).unwrap();
            let b = Tensor::randn([c_out], 0.0, 1.0, DType::F32, &d, &mut rng).unwrap();
            let g = Tensor::randn([batch, c_out, size, size], 0.0, 1.0, DType::F32, &d, &mut rng).unwrap();
            let o = Conv2dOptions::default().padding(pad);
            let (wv, bv, xv) = (w.var().unwrap(), b.var().unwrap(), x.var().unwrap());
            let fwd = time(|| { x.conv2d(&w, Some(&b), o).unwrap(); });
            if std::env::var("FWD_ONLY").is_ok() {
                // For profiling the forward alone.
                let gflops = 2.0 * (batch * c_out * size * size * c_in * k * k) as f64 / 1e9;
                println!("{name}: forward {:.2} ms ({:.0} GFLOP/s)", fwd * 1e3, gflops / fwd);
                continue;
            }
            let with_dw = time(|| { x.conv2d(&wv, Some(&bv), o).unwrap().backward_with(&g).unwrap(); });
            let with_dx = time(|| { xv.conv2d(&w, Some(&b), o).unwrap().backward_with(&g).unwrap(); });
            let y = x.conv2d(&w, Some(&b), o).unwrap().relu().unwrap();
            let yv = y.var().unwrap();
            let gp = Tensor::randn([batch, c_out, size / 2, size / 2], 0.0, 1.0, DType::F32, &d, &mut rng).unwrap();
            let pool = time(|| { y.max_pool2d([2, 2], [2, 2], [0, 0]).unwrap(); });
            let pool_bwd = time(|| { yv.max_pool2d([2, 2], [2, 2], [0, 0]).unwrap().backward_with(&gp).unwrap(); });
            let gflops = 2.0 * (batch * c_out * size * size * c_in * k * k) as f64 / 1e9;
            println!("{name}: forward {:.2} ms ({:.0} GFLOP/s), weight+bias gradient {:.2} ms, input gradient {:.2} ms, max-pool 2x2 {:.2} ms, its gradient {:.2} ms",
                fwd * 1e3, gflops / fwd, (with_dw - fwd) * 1e3, (with_dx - fwd) * 1e3, pool * 1e3, (pool_bwd - pool) * 1e3);
        }
    } else if what == "spmv" {
        // The sparse suite's random16 and power-law matrices (kiln-bench's generator):
        // SpMV ms (median), 1 and 2 threads.
        let n = 1usize << 20;
        for kind in std::env::var("KINDS").unwrap_or("cycle,random16,powerlaw".into()).split(",") {
            let (rp, ci) = if kind.starts_with("fixed") || kind.starts_with("var") {
                // fixedD: D entries a row; varD: 4..=D entries (uniform), random columns.
                let d: usize = kind.trim_start_matches(|c: char| c.is_alphabetic()).parse().unwrap();
                let mut h = 0x9E3779B97F4A7C15u64;
                let mut next = || { h ^= h << 13; h ^= h >> 7; h ^= h << 17; h };
                let (mut rp, mut ci) = (vec![0i64], vec![]);
                for _ in 0..n {
                    let len = if kind.starts_with("fixed") { d } else { 4 + (next() % (d as u64 - 3)) as usize };
                    let st = ci.len();
                    for _ in 0..len { ci.push((next() % n as u64) as i64); }
                    ci[st..].sort_unstable();
                    rp.push(ci.len() as i64);
                }
                (rp, ci)
            } else { kiln_bench::bench_matrix(kind, n) };
            let reps: usize = std::env::var("REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
            let nnz = ci.len();
            let d = Device::Cpu;
            let v = Tensor::randn([nnz], 0.0, 1.0, DType::F32, &d, &mut rng).unwrap();
            let a = kiln::sparse::Csr::new(n, n, &Tensor::from_vec(rp, n + 1, &d).unwrap(), &Tensor::from_vec(ci, nnz, &d).unwrap(), &v).unwrap();
            let x = Tensor::randn([n], 0.0, 1.0, DType::F32, &d, &mut rng).unwrap();
            let mut line = format!("{kind:9} nnz {nnz:9}");
            let threads: Vec<usize> = std::env::var("THREADS").unwrap_or("1,2".into()).split(',').map(|t| t.parse().unwrap()).collect();
            for th in threads {
                kiln::set_num_threads(th).unwrap();
                let s = time(|| { a.matmul(&x).unwrap(); });
                let mut fastest = f64::INFINITY;
                for _ in 0..40 { let t = Instant::now(); a.matmul(&x).unwrap(); fastest = fastest.min(t.elapsed().as_secs_f64()); }
                let y = Tensor::zeros([n], DType::F32, &d).unwrap();
                let into = time(|| { a.matmul_into(1.0, &x, 0.0, &y).unwrap(); });
                line += &format!("  {th}t {:7.2} ms (into {:7.2} ms, fastest {:7.2})", s * 1e3, into * 1e3, fastest * 1e3);
            }
            kiln::set_num_threads(0).unwrap();
            println!("{line}");
        }
    } else if what == "loop" {
        // `loop R C OP N`: OP (softmax, log_softmax, sum-1) of an R x C matrix N times (for perf).
        let (r, c): (usize, usize) = (args[2].parse().unwrap(), args[3].parse().unwrap());
        let n: usize = args[5].parse().unwrap();
        let x = Tensor::randn([r, c], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        // The fastest of batches of 100 calls: other tenants' noise only ever adds time.
        let mut best = f64::INFINITY;
        let t = Instant::now();
        for _ in 0..n.div_ceil(100) {
            let b = Instant::now();
            for _ in 0..100 {
                match args[4].as_str() {
                    "softmax" => drop(x.softmax(-1).unwrap()),
                    "log_softmax" => drop(x.log_softmax(-1).unwrap()),
                    _ => drop(x.sum(-1, false).unwrap()),
                }
            }
            best = best.min(b.elapsed().as_secs_f64() / 100.0);
        }
        println!("{} {:.2} us each ({:.2} fastest batch)", args[4], t.elapsed().as_secs_f64() / n as f64 * 1e6, best * 1e6);
    } else if what == "sm" {
        let x = Tensor::randn([4096, 1024], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        for _ in 0..200 { x.softmax(-1).unwrap(); }
    } else {
        if let Some(th) = args.get(4) { kiln::set_num_threads(th.parse().unwrap()).unwrap(); }
        let r: usize = args[2].parse().unwrap(); let c: usize = args[3].parse().unwrap();
        let x = Tensor::randn([r, c], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        for (name, f) in [("softmax", (|t: &Tensor| t.softmax(-1)) as fn(&Tensor)->kiln::Result<Tensor>), ("log_softmax", |t| t.log_softmax(-1)), ("sum-1", |t| t.sum(-1, false)), ("sum0", |t| t.sum(0, false)), ("max-1", |t| t.max(-1, false)), ("argmax-1", |t| t.argmax(-1, false)), ("lse", |t| t.logsumexp(-1, false))] {
            if std::env::var("ONLY").is_ok_and(|o| o != name) { continue; }
            let s = time(|| { f(&x).unwrap(); });
            println!("{name:10} {:8.2} us  {:7.2} GB/s(8B/elem)", s*1e6, 8.0 * (r*c) as f64 / s / 1e9);
        }
    }
}

