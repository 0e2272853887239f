//! CPU benchmarks of the core issue: GEMM GFLOP/s, add and sum bandwidth, view cost.
//!
//! `cargo bench -p kiln --bench core [-- --quick]`. Each figure is the median of repeated
//! runs after a warm-up, on random data. Bandwidth counts bytes read plus bytes written.

use kiln::{AllDims, DType, Device, Generator, Tensor};
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
// SAFETY: forwards to the system allocator unchanged, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}
#[global_allocator]
static GLOBAL: Counting = Counting;

/// Median seconds per call of `f`, after warm-up, over at least `min_reps` runs or
/// `budget` of time.
fn median_secs(mut f: impl FnMut(), min_reps: usize, budget: Duration) -> f64 {
    for _ in 0..2 {
        f();
    }
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < min_reps || (start.elapsed() < budget && times.len() < 1000) {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let budget = Duration::from_millis(if quick { 50 } else { 1000 });
    let dev = Device::Cpu;
    let mut rng = Generator::new(0);
    println!(
        "kiln core benchmarks: CPU, {} threads{}",
        kiln::num_threads(),
        if quick { " (quick)" } else { "" }
    );

    println!("\nGEMM f32 (C = A·B, square)");
    println!(
        "{:>6} {:>12} {:>10} {:>16}",
        "n", "median ms", "GFLOP/s", "A^T view GFLOP/s"
    );
    let sizes: &[usize] = if quick {
        &[64, 256]
    } else {
        &[64, 256, 512, 1024, 2048]
    };
    for &n in sizes {
        let a = Tensor::randn([n, n], 0.0, 1.0, DType::F32, &dev, &mut rng).unwrap();
        let b = Tensor::randn([n, n], 0.0, 1.0, DType::F32, &dev, &mut rng).unwrap();
        let at = a.t().unwrap();
        let flops = 2.0 * (n as f64).powi(3);
        let t = median_secs(|| drop(black_box(a.matmul(&b).unwrap())), 3, budget);
        let tt = median_secs(|| drop(black_box(at.matmul(&b).unwrap())), 3, budget);
        println!(
            "{n:>6} {:>12.3} {:>10.1} {:>16.1}",
            t * 1e3,
            flops / t / 1e9,
            flops / tt / 1e9
        );
    }

    println!("\nadd (f32, contiguous) and sum (f32, all elements)");
    println!(
        "{:>10} {:>12} {:>10} {:>12} {:>10}",
        "elements", "add µs", "add GB/s", "sum µs", "sum GB/s"
    );
    let counts: &[usize] = if quick {
        &[1 << 10, 1 << 16]
    } else {
        &[1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 24]
    };
    for &n in counts {
        let x = Tensor::randn(n, 0.0, 1.0, DType::F32, &dev, &mut rng).unwrap();
        let y = Tensor::randn(n, 0.0, 1.0, DType::F32, &dev, &mut rng).unwrap();
        let ta = median_secs(|| drop(black_box(x.add(&y).unwrap())), 5, budget);
        let ts = median_secs(
            || drop(black_box(x.sum(AllDims, false).unwrap())),
            5,
            budget,
        );
        let bytes_add = 3.0 * 4.0 * n as f64;
        let bytes_sum = 4.0 * n as f64;
        println!(
            "{n:>10} {:>12.2} {:>10.2} {:>12.2} {:>10.2}",
            ta * 1e6,
            bytes_add / ta / 1e9,
            ts * 1e6,
            bytes_sum / ts / 1e9
        );
    }

    println!("\nview cost (ns per op; heap allocations per op)");
    for rank in [2usize, 4, 6] {
        let shape: Vec<usize> = (0..rank).map(|_| 3).collect();
        let t = Tensor::zeros(&shape[..], DType::F32, &dev).unwrap();
        let reps = 1_000_000;
        let ns = |f: &dyn Fn() -> Tensor| {
            let before = ALLOCS.load(Ordering::SeqCst);
            let s = median_secs(
                || {
                    for _ in 0..1000 {
                        black_box(f());
                    }
                },
                11,
                budget,
            );
            let allocs = (ALLOCS.load(Ordering::SeqCst) - before) as f64 / reps as f64;
            (s / 1000.0 * 1e9, allocs)
        };
        let (tr, tra) = ns(&|| black_box(&t).transpose(0, rank - 1).unwrap());
        let (na, naa) = ns(&|| black_box(&t).narrow(0, 1, 2).unwrap());
        let (bc, bca) = ns(&|| black_box(&t).broadcast_as(&shape[..]).unwrap());
        let ic = median_secs(
            || {
                for _ in 0..1000 {
                    black_box(black_box(&t).is_contiguous());
                }
            },
            11,
            budget,
        ) / 1000.0
            * 1e9;
        println!(
            "rank {rank}: transpose {tr:.1} ns ({tra:.3} allocs), narrow {na:.1} ns ({naa:.3}), broadcast {bc:.1} ns ({bca:.3}), is_contiguous {ic:.1} ns"
        );
    }
}
