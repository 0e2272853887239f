//! kiln's few-output-channel convolution on CUDA (`kernels/conv_few.cu`), forced with
//! `kiln::cuda::set_conv_engine(ConvEngine::Kiln)`: forwards into 1–3 channels (plain, bias,
//! bias + ReLU) and input gradients of layers with 1–3 input channels, against the f64 loop
//! nests, in f32, f64, bf16 and f16, on contiguous and non-contiguous inputs. The shapes cover
//! 3×3, 5×5 and 7×7 filters, 1–3 output channels (the 3-channel kernels with 2), input
//! channels that do not fill the last staged chunk, tiles cut short at the image's right and
//! bottom edges, images smaller than one thread's patch, padding wider than the filter, and
//! blocks of 1, 2, 4 and 8 groups of threads. Normally the kernel runs only where it measured
//! faster than the alternative, so this test is what exercises it on every shape. One test
//! function: the engine is a process-wide setting.
#![cfg(feature = "cuda")]

mod common;
use common::conv::*;
use common::*;
use kiln::cuda::{conv_few_launches, force_conv_few_split, set_conv_engine, ConvEngine};
use kiln::op::EpilogueActivation;
use kiln::{Conv2dOptions, DType, Device, Generator};

#[test]
fn few_output_channel_convolutions_match_the_reference() {
    let Some(device) = devices().into_iter().find(|d| matches!(d, Device::Cuda(_))) else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    let o = Conv2dOptions::default;
    let cases = [
        // The CNN's first layer: its input gradient is a 32→1 5×5 convolution.
        ([2, 1, 28, 28], [32, 1, 5, 5], o().padding(2)),
        // A forward into one channel from many (chunks of staged channels).
        ([3, 37, 14, 14], [1, 37, 5, 5], o().padding(2)),
        // RGB: the input gradient into 3 channels, two tiles across and several down.
        ([1, 3, 37, 45], [16, 3, 3, 3], o().padding(1)),
        // 7×7 into 2 channels both ways (the 3-channel kernel, one channel unused).
        ([2, 2, 19, 23], [40, 2, 7, 7], o().padding(3)),
        (
            [2, 13, 11, 9],
            [2, 13, 7, 7],
            Conv2dOptions {
                padding: [1, 3],
                ..o()
            },
        ),
        // Padding wider than the filter reaches (output larger than the input).
        ([2, 5, 6, 5], [1, 5, 5, 5], o().padding(4)),
        // Images smaller than a thread's patch of 4 × 4 pixels.
        ([3, 7, 2, 3], [3, 7, 3, 3], o().padding(1)),
    ];
    let cudnn = kiln::cuda::convolution_path().starts_with("cuDNN");
    let mut rng = Generator::new(43);
    set_conv_engine(ConvEngine::Kiln);
    let splits = [None, Some(1), Some(2), Some(4), Some(8)];
    let dtypes = [DType::F32, DType::F64, DType::BF16, DType::F16];
    for (k_run, (split, dtype)) in splits
        .into_iter()
        .flat_map(|s| dtypes.map(|d| (s, d)))
        .enumerate()
    {
        force_conv_few_split(split);
        let tol = match dtype {
            DType::F32 => 1e-5,
            DType::F64 => 1e-10,
            _ => 2e-2,
        };
        for (k, (xs, ws, o)) in cases.into_iter().enumerate() {
            let variant = VARIANTS[(k + k_run) % VARIANTS.len()];
            let ctx = format!("conv2d {xs:?} * {ws:?} {o:?} {dtype} {variant:?} split {split:?}");
            let Params {
                x,
                w,
                bias_vals,
                xv,
                wv,
                bv,
            } = tracked_params(&mut rng, xs, ws, dtype, &device, variant);
            // A forced split applies where the block has that many groups' worth of channels.
            let admissible = |channels: usize| split.is_none_or(|s| s == 1 || s <= channels);
            let forward_few = ws[0] <= 3 && admissible(xs[1]);
            let input_grad_few = xs[1] <= 3 && admissible(ws[0]);
            let before = conv_few_launches();
            let (plain, _) = conv_reference(&x.vals, xs, &w.vals, ws, None, &o);
            let got = xv.conv2d(&wv, None, o).unwrap();
            assert_norm_close(&format!("y of {ctx}"), &values(&got), &plain, tol);
            let (biased, _) = conv_reference(&x.vals, xs, &w.vals, ws, Some(&bias_vals), &o);
            let relu = Some(EpilogueActivation::Relu);
            let got = xv.conv2d_act(&wv, Some(&bv), o, relu).unwrap();
            let want: Vec<f64> = biased.iter().map(|v| v.max(0.0)).collect();
            assert_norm_close(&format!("relu(y + b) of {ctx}"), &values(&got), &want, tol);
            let y = xv.conv2d(&wv, Some(&bv), o).unwrap();
            assert_norm_close(&format!("y + b of {ctx}"), &values(&y), &biased, tol);
            let forwards = conv_few_launches() - before;
            assert_eq!(
                forwards,
                3 * u64::from(forward_few),
                "{ctx}: forwards by the kernel"
            );
            let (r_vals, grads) = seeded_backward(&mut rng, &y, dtype, &device);
            let input_grads = conv_few_launches() - before - forwards;
            // Without cuDNN, a forward none of kiln's kernels computes is im2col + GEMM,
            // whose backward is that of the GEMM: no input-gradient convolution to route.
            if cudnn {
                assert_eq!(
                    input_grads,
                    u64::from(input_grad_few),
                    "{ctx}: input gradients by the kernel"
                );
            } else {
                assert!(
                    input_grads <= u64::from(input_grad_few),
                    "{ctx}: {input_grads} input gradients by the kernel"
                );
            }
            let want = conv_grads_reference(&x.vals, xs, &w.vals, ws, &r_vals, &o);
            let ctx = |what: &str| format!("d{what} of {ctx}");
            assert_conv_grads(ctx, &grads, [&xv, &wv, &bv], &want, tol);
        }
    }
    force_conv_few_split(None);
    set_conv_engine(ConvEngine::Measure);
}
