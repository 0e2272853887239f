//! kiln's own small-GEMM kernel on CUDA (`kernels/gemm.cu`), forced with
//! `kiln::cuda::set_gemm_engine(GemmEngine::Kiln)`: plain, bias and bias+ReLU products and
//! batched products on every layout variant, against f64 references. Normally the kernel
//! runs only where the plan tuner measured it fastest, so this test is what exercises it on
//! every shape. One test function: the engine is a process-wide setting.
#![cfg(feature = "cuda")]

mod common;
use common::*;
use kiln::cuda::{set_gemm_engine, GemmEngine};
use kiln::op::EpilogueActivation;
use kiln::{DType, Device, Generator};

fn product(a: &[f64], b: &[f64], (m, k, n): (usize, usize, usize)) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    out
}

#[test]
fn the_small_gemm_kernel_matches_the_reference_on_every_layout() {
    let Some(device) = devices().into_iter().find(|d| matches!(d, Device::Cuda(_))) else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    let mut rng = Generator::new(31);
    let mut sizes: Vec<(usize, usize, usize)> = (0..6)
        .map(|_| (1 + rng.below(70), 1 + rng.below(300), 1 + rng.below(70)))
        .collect();
    // The MLP's products: forward, input gradient, the narrow weight gradient.
    sizes.extend([(256, 784, 128), (256, 10, 128), (10, 256, 128), (33, 1, 17)]);
    for engine in [GemmEngine::Kiln, GemmEngine::Library] {
        set_gemm_engine(engine);
        for (case, &(m, k, n)) in sizes.iter().enumerate() {
            let va = VARIANTS[case % VARIANTS.len()];
            let vb = VARIANTS[(case + 2) % VARIANTS.len()];
            let dt = DType::F32;
            let a = input(&mut rng, &[m, k], dt, &device, va, Range::Signed);
            let b = input(&mut rng, &[k, n], dt, &device, vb, Range::Signed);
            let bias = input(
                &mut rng,
                &[n],
                dt,
                &device,
                Variant::Contiguous,
                Range::Signed,
            );
            let ctx = format!("{engine:?} {va:?}x{vb:?} {m}x{k}x{n}");
            let want = product(&a.vals, &b.vals, (m, k, n));
            let got = a.t.matmul(&b.t).unwrap();
            assert_norm_close(&format!("matmul {ctx}"), &values(&got), &want, 1e-5);
            let biased: Vec<f64> = want
                .iter()
                .enumerate()
                .map(|(i, v)| v + bias.vals[i % n])
                .collect();
            let got = a.t.matmul_bias(&b.t, &bias.t).unwrap();
            assert_norm_close(&format!("matmul_bias {ctx}"), &values(&got), &biased, 1e-5);
            let relu: Vec<f64> = biased.iter().map(|v| v.max(0.0)).collect();
            let got =
                a.t.matmul_bias_act(&b.t, &bias.t, EpilogueActivation::Relu)
                    .unwrap();
            assert_norm_close(
                &format!("matmul_bias_act {ctx}"),
                &values(&got),
                &relu,
                1e-5,
            );
        }
        // Batched, each batch its own pair.
        let (batch, m, k, n) = (3, 20, 150, 24);
        let a = input(
            &mut rng,
            &[batch, m, k],
            DType::F32,
            &device,
            Variant::Transposed,
            Range::Signed,
        );
        let b = input(
            &mut rng,
            &[batch, k, n],
            DType::F32,
            &device,
            Variant::Contiguous,
            Range::Signed,
        );
        let want: Vec<f64> = (0..batch)
            .flat_map(|i| {
                product(
                    &a.vals[i * m * k..(i + 1) * m * k],
                    &b.vals[i * k * n..(i + 1) * k * n],
                    (m, k, n),
                )
            })
            .collect();
        let got = a.t.matmul(&b.t).unwrap();
        assert_norm_close(&format!("batched {engine:?}"), &values(&got), &want, 1e-5);
    }
    set_gemm_engine(GemmEngine::Measure);
}
