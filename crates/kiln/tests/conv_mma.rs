//! kiln's tensor-core convolution on CUDA (`kernels/conv_mma.cu`), forced with
//! `kiln::cuda::set_conv_engine(ConvEngine::Kiln)`: forward (plain, bias, bias + ReLU) and
//! all three gradients against the f64 loop nests, in f32 with TF32, bf16 and f16, on
//! contiguous and non-contiguous inputs, for shapes that cover its band heights, flat pixel
//! ranges across images, channel tiles, padded channels, strides and dilations; on an sm_90
//! GPU also with Hopper's warpgroup MMA (`conv_wg*`). The weight gradients of at least 8
//! input channels and undilated filter rows of 2–7 taps (16-bit: even widths) run on the
//! tensor-core weight gradient (`kernels/conv_wgrad_mma.cu`): whole images, bands with a short last one,
//! channel tiles part filled, a stride, a non-contiguous input, and (a forced plan) blocks
//! that walk bands of different heights with a bias. Normally the
//! kernel runs only where it measured faster than cuDNN, so this test is what exercises it
//! on every shape. One test function: the engine and TF32 are process-wide settings.
#![cfg(feature = "cuda")]

mod common;
use common::conv::*;
use common::*;
use kiln::cuda::{
    conv_mma_fused_launches, conv_mma_launches, conv_wgrad_mma_launches, force_conv_mma_tiling,
    force_conv_wgrad_mma_plan, set_conv_engine, set_conv_mma_filter_prep, set_tf32, ConvEngine,
    ConvMmaFilterPrep, ConvMmaTiling,
};
use kiln::op::EpilogueActivation;
use kiln::{Conv2dOptions, DType, Device, Generator};

#[test]
fn tensor_core_convolutions_match_the_reference() {
    let Some(device) = devices().into_iter().find(|d| matches!(d, Device::Cuda(_))) else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    let o = Conv2dOptions::default;
    let cases = [
        // The CNN's second layer and the 32→64 3×3 layer (bands of an image).
        ([2, 32, 14, 14], [64, 32, 5, 5], o().padding(2)),
        ([3, 32, 28, 28], [64, 32, 3, 3], o().padding(1)),
        // Channels short of an MMA step, 7 outputs (one narrow tile, partly filled); more
        // than the 64 taps a channel of the direct kernel, which the engine would force first.
        ([3, 5, 9, 11], [7, 5, 5, 3], o().padding(1)),
        // 64 input channels, 33 outputs (a wide tile and one column of the next).
        ([1, 64, 7, 7], [33, 64, 3, 3], o().padding(1)),
        // A tall image without padding; a stride (input gradient by cuDNN) with dilation.
        ([2, 8, 30, 9], [16, 8, 3, 3], o()),
        (
            [2, 20, 13, 10],
            [40, 20, 3, 5],
            Conv2dOptions {
                stride: [2, 1],
                padding: [1, 2],
                dilation: [1, 2],
                groups: 1,
            },
        ),
        // A stride of 2 and an odd width (the weight gradient's rows one float at a time).
        ([2, 16, 15, 13], [24, 16, 3, 3], o().stride(2).padding(1)),
        // Images of 12 output pixels: a flat range of 128 spans 11 of them, one of 192 17.
        ([23, 12, 3, 4], [20, 12, 3, 3], o().padding(1)),
        // Dilation at stride 1 (the input gradient's padding differs per axis).
        (
            [2, 16, 11, 12],
            [24, 16, 3, 3],
            Conv2dOptions {
                padding: [2, 1],
                dilation: [2, 1],
                ..o()
            },
        ),
    ];
    let mut rng = Generator::new(41);
    set_conv_engine(ConvEngine::Kiln);
    set_tf32(true);
    let Device::Cuda(ordinal) = device else {
        unreachable!()
    };
    let hopper = kiln::cuda::device_info(ordinal).unwrap().compute_capability == (9, 0);
    let mut tilings = vec![ConvMmaTiling::Bands, ConvMmaTiling::Flat];
    if hopper {
        tilings.push(ConvMmaTiling::Warpgroup);
    } else {
        eprintln!("warpgroup kernels not run: the GPU is not sm_90");
    }
    for (k_tiling, (tiling, dtype)) in tilings
        .into_iter()
        .flat_map(|t| [DType::F32, DType::BF16, DType::F16].map(|d| (t, d)))
        .enumerate()
    {
        force_conv_mma_tiling(Some(tiling));
        // Each tiling starts the layout variants, and the ways to prepare the filter, one
        // further along.
        let shift = k_tiling / 3;
        let preps = [
            ConvMmaFilterPrep::Separate,
            ConvMmaFilterPrep::FusedAlways,
            ConvMmaFilterPrep::FusedEveryBlock,
        ];
        let prep = preps[(k_tiling + shift) % preps.len()];
        set_conv_mma_filter_prep(prep);
        let (fused_before, launches_before) = (conv_mma_fused_launches(), conv_mma_launches());
        // TF32 keeps 10 mantissa bits of each operand.
        let tol = if dtype == DType::F32 { 2e-3 } else { 2e-2 };
        for (k, (xs, ws, o)) in cases.into_iter().enumerate() {
            let variant = VARIANTS[(k + shift) % VARIANTS.len()];
            let ctx =
                format!("conv2d {xs:?} * {ws:?} {o:?} {dtype} {variant:?} {tiling:?} {prep:?}");
            let Params {
                x,
                w,
                bias_vals,
                xv,
                wv,
                bv,
            } = tracked_params(&mut rng, xs, ws, dtype, &device, variant);
            let launches = conv_mma_launches();
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
            let forwards = conv_mma_launches() - launches;
            assert!(forwards >= 3, "{ctx}: {forwards} forwards by the kernel");
            let wgrads_before = conv_wgrad_mma_launches();
            let (r_vals, grads) = seeded_backward(&mut rng, &y, dtype, &device);
            let input_grads = conv_mma_launches() - launches - forwards;
            // 16-bit rows go two elements at a time: even input and output widths.
            let ow = (xs[3] + 2 * o.padding[1] - o.dilation[1] * (ws[3] - 1) - 1) / o.stride[1] + 1;
            let wgrad_mma = xs[1] >= 8
                && o.dilation == [1, 1]
                && (2..=7).contains(&ws[3])
                && (dtype == DType::F32 || (xs[3] % 2 == 0 && ow % 2 == 0));
            assert_eq!(
                conv_wgrad_mma_launches() - wgrads_before,
                u64::from(wgrad_mma),
                "{ctx}: weight gradients by the tensor-core kernel"
            );
            let stride_1 = o.stride == [1, 1];
            assert_eq!(
                input_grads,
                u64::from(stride_1),
                "{ctx}: input gradients by the kernel"
            );
            let want = conv_grads_reference(&x.vals, xs, &w.vals, ws, &r_vals, &o);
            let ctx = |what: &str| format!("d{what} of {ctx}");
            assert_conv_grads(ctx, &grads, [&xv, &wv, &bv], &want, tol);
        }
        // The test's grids are all resident at once: every launch fuses, or none does.
        let fused = conv_mma_fused_launches() - fused_before;
        let launches = conv_mma_launches() - launches_before;
        let want = if prep == ConvMmaFilterPrep::Separate {
            0
        } else {
            launches
        };
        assert_eq!(
            fused, want,
            "{tiling:?} {dtype} {prep:?}: fused of {launches} launches"
        );
    }
    force_conv_mma_tiling(None);
    // Blocks that walk units of bands of different heights, with a bias: 5 output rows in
    // bands of 2 (the last of 1), 9 units over 2 blocks, so that a stage holding a short band
    // held a longer one two units before, whose tail neither the weight's sums nor the
    // bias's may read. Blocks of one and of two channel groups (the bias rows shared out
    // over 2 and over 1).
    set_tf32(true);
    let (xs, ws, o) = ([3, 16, 5, 12], [24, 16, 3, 3], o().padding(1));
    let plans = [2, 1]
        .into_iter()
        .flat_map(|g| [DType::F32, DType::BF16, DType::F16].map(|d| (g, d)));
    for (k, (groups, dtype)) in plans.enumerate() {
        force_conv_wgrad_mma_plan(Some([groups, 2, 2]));
        let variant = VARIANTS[k % VARIANTS.len()];
        let ctx = format!(
            "conv2d {xs:?} * {ws:?} {o:?} {dtype} {variant:?}, {groups} channel groups, bands of 2"
        );
        let Params {
            x,
            w,
            bias_vals: _,
            xv,
            wv,
            bv,
        } = tracked_params(&mut rng, xs, ws, dtype, &device, variant);
        let y = xv.conv2d(&wv, Some(&bv), o).unwrap();
        let before = conv_wgrad_mma_launches();
        let (r_vals, grads) = seeded_backward(&mut rng, &y, dtype, &device);
        assert_eq!(
            conv_wgrad_mma_launches() - before,
            1,
            "{ctx}: weight gradients by the kernel"
        );
        let want = conv_grads_reference(&x.vals, xs, &w.vals, ws, &r_vals, &o);
        let ctx = |what: &str| format!("d{what} of {ctx}");
        let tol = if dtype == DType::F32 { 2e-3 } else { 2e-2 };
        assert_conv_grads(ctx, &grads, [&xv, &wv, &bv], &want, tol);
    }
    force_conv_wgrad_mma_plan(None);
    set_conv_mma_filter_prep(ConvMmaFilterPrep::Fused);
    set_tf32(false);
    set_conv_engine(ConvEngine::Measure);
}
