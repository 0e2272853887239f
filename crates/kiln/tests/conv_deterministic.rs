//! Convolutions on CUDA with `kiln::cuda::set_conv_deterministic(true)`: cuDNN's search
//! leaves out its nondeterministic algorithms and engines. The CNN's layers (and a strided
//! one) in f32 and bf16, forward and all three gradients, against the f64 loop nests, and a
//! second run of each giving the same bits. Its own test executable: the setting is
//! process-wide.
#![cfg(feature = "cuda")]

mod common;
use common::conv::*;
use common::*;
use kiln::{Conv2dOptions, DType, Device, Generator};

#[test]
fn deterministic_convolutions_match_the_reference_and_repeat_bit_for_bit() {
    let Some(device) = devices().into_iter().find(|d| matches!(d, Device::Cuda(_))) else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    kiln::cuda::set_conv_deterministic(true);
    assert!(kiln::cuda::conv_deterministic());
    let o = Conv2dOptions::default;
    let cases = [
        ([16, 1, 28, 28], [32, 1, 5, 5], o().padding(2)),
        ([16, 32, 14, 14], [64, 32, 5, 5], o().padding(2)),
        ([4, 64, 14, 14], [64, 64, 3, 3], o().padding(1).stride(2)),
    ];
    let mut rng = Generator::new(12);
    for dtype in [DType::F32, DType::BF16] {
        let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
        for (k, (xs, ws, o)) in cases.into_iter().enumerate() {
            let variant = VARIANTS[k % VARIANTS.len()];
            let ctx = format!("conv2d {xs:?} * {ws:?} {o:?} {dtype} {variant:?}");
            let p = tracked_params(&mut rng, xs, ws, dtype, &device, variant);
            let y_shape = conv_out_shape(xs, ws, &o);
            let r_vals = random_vals(&mut rng, y_shape.iter().product(), dtype, Range::Signed);
            let r = tensor_of(&r_vals, &y_shape, dtype, &device);
            let run = || {
                let y = p.xv.conv2d(&p.wv, Some(&p.bv), o).unwrap();
                let grads = backward_of_product(&y, &r);
                let bits = [&p.xv, &p.wv, &p.bv].map(|t| values(grads.get(t).unwrap()));
                (y, grads, bits)
            };
            let (y, grads, first) = run();
            let (biased, _) = conv_reference(&p.x.vals, xs, &p.w.vals, ws, Some(&p.bias_vals), &o);
            assert_norm_close(&format!("y of {ctx}"), &values(&y), &biased, tol);
            let want = conv_grads_reference(&p.x.vals, xs, &p.w.vals, ws, &r_vals, &o);
            let named = |what: &str| format!("d{what} of {ctx}");
            assert_conv_grads(named, &grads, [&p.xv, &p.wv, &p.bv], &want, tol);
            let (y2, _, second) = run();
            assert_eq!(
                values(&y),
                values(&y2),
                "{ctx}: the forward differs between runs"
            );
            for (what, (a, b)) in ["x", "w", "bias"].iter().zip(first.iter().zip(&second)) {
                assert!(a == b, "{ctx}: d{what} differs between runs");
            }
        }
    }
}
