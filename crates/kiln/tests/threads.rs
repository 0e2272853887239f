//! Ops on shared tensors from several threads at once, on every device: each thread's
//! results equal the ones computed alone beforehand, in-place updates of one shared
//! accumulator from every thread all land, and the caching allocator survives tensors made
//! and dropped concurrently.

mod common;

use common::*;
use kiln::{AllDims, DType, Generator, Tensor};

const THREADS: usize = 6;

/// Iterations per thread: 60, or `KILN_THREADS_ITERS` (the sanitizer runs take fewer: each
/// iteration is ~15 launches, and racecheck makes a launch cost ~0.1 s).
fn iters() -> usize {
    std::env::var("KILN_THREADS_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}

/// Everything one iteration computes from the shared inputs, read back to the host.
fn work(a: &Tensor, b: &Tensor, w: &Tensor, ids: &Tensor) -> Vec<Vec<f64>> {
    let prod = a.matmul(b).unwrap();
    let soft = prod.softmax(1).unwrap();
    let picked = soft.index_select(ids, 0).unwrap();
    let col_max = prod.max(0, false).unwrap();
    let loss = a
        .matmul(w)
        .unwrap()
        .relu()
        .unwrap()
        .sqr()
        .unwrap()
        .sum(AllDims, false)
        .unwrap();
    let grads = loss.backward().unwrap();
    let gw = grads.get(w).unwrap().clone();
    [prod, soft, picked, col_max, loss, gw]
        .iter()
        .map(values)
        .collect()
}

#[test]
fn threads_share_tensors_safely() {
    let mut rng = Generator::new(8);
    let iters = iters();
    for device in devices() {
        // A transposed view, a narrowed view and a parameter, shared by every thread.
        let a = Tensor::randn([40, 64], 0.0, 1.0, DType::F32, &device, &mut rng)
            .unwrap()
            .t()
            .unwrap();
        let b = Tensor::randn([48, 40], 0.0, 1.0, DType::F32, &device, &mut rng)
            .unwrap()
            .narrow(0, 8, 40)
            .unwrap();
        let w = Tensor::randn([40, 24], 0.0, 0.3, DType::F32, &device, &mut rng)
            .unwrap()
            .var()
            .unwrap();
        let ids = Tensor::from_vec(vec![3i64, 0, 63, 17, 17], 5, &device).unwrap();
        let alone = work(&a, &b, &w, &ids);
        let total = Tensor::zeros([7], DType::I64, &device).unwrap();
        let ones = Tensor::ones([7], DType::I64, &device).unwrap();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (a, b, w, ids, total, ones, alone) = (&a, &b, &w, &ids, &total, &ones, &alone);
                s.spawn(move || {
                    let mut rng = Generator::new(100 + t as u64);
                    for i in 0..iters {
                        let got = work(a, b, w, ids);
                        for (k, (g, want)) in got.iter().zip(alone).enumerate() {
                            assert_close(
                                &format!("{device} thread {t} iteration {i} result {k}"),
                                g,
                                want,
                                1e-5,
                            );
                        }
                        total.add_assign(ones).unwrap();
                        // Tensors of varied sizes made and dropped: the allocator's pool is
                        // shared by every thread.
                        let n = 1 + rng.below(1 << 16);
                        let scratch = Tensor::full(t as f64, [n], DType::F32, &device).unwrap();
                        let sum = scratch.sum(AllDims, false).unwrap();
                        assert_eq!(values(&sum), [(n * t) as f64], "{device} thread {t}");
                    }
                });
            }
        });
        assert_eq!(
            values(&total),
            vec![(THREADS * iters) as f64; 7],
            "{device}: every in-place add from every thread landed"
        );
    }
}
